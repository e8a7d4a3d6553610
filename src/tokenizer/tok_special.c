/* Special tokens: ids from metadata, llama.cpp's detection of end-of-turn / FIM
 * / end-of-generation tokens by their text, its attribute fix-ups, and the list
 * of tokens that split input text. Each rule mirrors llama_vocab::load because
 * these decide both what text becomes a single id and when generation stops. */
#include <ctype.h>
#include <stdio.h>

#include "tok_internal.h"

static bool has_text(const tok_vocab *v, int32_t id, const char *s) {
    return strlen(s) == v->str.len[id] && memcmp(v->str.s[id], s, v->str.len[id]) == 0;
}

static bool text_in(const tok_vocab *v, int32_t id, const char *const *list) {
    for (; *list; list++) {
        if (has_text(v, id, *list)) return true;
    }
    return false;
}

static void set_defaults(tok_vocab *v) {
    tok_specials *sp = &v->sp;
    memset(sp, 0xFF, sizeof *sp); /* every id -1 */
    if (v->kind == TOK_KIND_SPM) {
        sp->bos = 1;
        sp->eos = 2;
        sp->unk = 0;
    } else if (strcmp(v->model, "gemma4") != 0) { /* gemma4: only what the file names */
        sp->bos = v->pre_no_bos ? -1 : 11;
        sp->eos = 11;
    }
}

typedef struct id_key {
    const char *key;
    size_t field; /* offset in tok_specials */
} id_key;

#define SPK(k, f)                                                                                  \
    { "tokenizer.ggml." k, offsetof(tok_specials, f) }
static const id_key ID_KEYS[] = {
    SPK("bos_token_id", bos),         SPK("eos_token_id", eos),
    SPK("eot_token_id", eot),         SPK("eom_token_id", eom),
    SPK("unknown_token_id", unk),     SPK("seperator_token_id", sep),
    SPK("padding_token_id", pad),     SPK("mask_token_id", mask),
    SPK("fim_pre_token_id", fim_pre), SPK("fim_suf_token_id", fim_suf),
    SPK("fim_mid_token_id", fim_mid), SPK("fim_pad_token_id", fim_pad),
    SPK("fim_rep_token_id", fim_rep), SPK("fim_sep_token_id", fim_sep),
    SPK("prefix_token_id", fim_pre),  SPK("suffix_token_id", fim_suf),
    SPK("middle_token_id", fim_mid),
};

/* Metadata ids replace the defaults; a default or an id outside the vocab is
 * dropped with a warning, as llama.cpp does. */
static void read_ids(tok_vocab *v, const gguf_file *f) {
    for (size_t i = 0; i < sizeof ID_KEYS / sizeof ID_KEYS[0]; i++) {
        int32_t *id = (int32_t *)((char *)&v->sp + ID_KEYS[i].field);
        if (*id >= v->n_tokens) *id = -1;
        int64_t val;
        if (!gguf_get_i64(f, ID_KEYS[i].key, &val)) continue;
        if (val < 0 || val >= v->n_tokens) {
            /* 0xFFFFFFFF / -1 is how converters write "none": not worth a warning */
            kvl_log(val == 0xFFFFFFFFll || val == -1 ? KVL_LOG_DEBUG : KVL_LOG_WARN,
                    "%s: bad special token %s = %lld, using %d", gguf_path(f), ID_KEYS[i].key,
                    (long long)val, (int)*id);
        } else {
            *id = (int32_t)val;
        }
    }
}

static bool read_flags(tok_vocab *v, const gguf_file *f, kvl_error *err) {
    bool b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b)) v->add_bos = b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &b)) v->add_eos = b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_sep_token", &b)) v->add_sep = b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &b)) v->add_space_prefix = b;
    if (v->force_bos && !v->add_bos) {
        /* llama.cpp overrides a false here: Gemma 4 prompts start with BOS. */
        kvl_log(KVL_LOG_WARN, "%s: tokenizer.ggml.add_bos_token is false; using true for %s",
                gguf_path(f), v->pre);
        v->add_bos = true;
    }
    if (v->add_bos && v->sp.bos < 0)
        return kvl_fail(err,
                        "%s: tokenizer: add_bos_token is true but there is no BOS id "
                        "(tokenizer.ggml.bos_token_id)",
                        gguf_path(f));
    if (v->add_eos && v->sp.eos < 0)
        return kvl_fail(err, "%s: tokenizer: add_eos_token is true but there is no EOS id",
                        gguf_path(f));
    if (v->add_sep && v->sp.sep < 0)
        return kvl_fail(err,
                        "%s: tokenizer: add_sep_token is true but there is no separator id "
                        "(tokenizer.ggml.seperator_token_id)",
                        gguf_path(f));
    return true;
}

static const char *const EOT_NAMES[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<|end_of_text|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "<\xEF\xBD\x9C"
                                        "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                                        "<end_of_utterance>",
                                        NULL};
static const char *const EOM_NAMES[] = {"<|eom_id|>", NULL};
static const char *const FIM_PRE_NAMES[] = {"<|fim_prefix|>",
                                            "<fim-prefix>",
                                            "<fim_prefix>",
                                            "<\xEF\xBD\x9C"
                                            "fim\xE2\x96\x81"
                                            "begin\xEF\xBD\x9C>",
                                            "<PRE>",
                                            "\xE2\x96\x81<PRE>",
                                            "<|code_prefix|>",
                                            "<|prefix|>",
                                            NULL};
static const char *const FIM_SUF_NAMES[] = {"<|fim_suffix|>",
                                            "<fim-suffix>",
                                            "<fim_suffix>",
                                            "<\xEF\xBD\x9C"
                                            "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
                                            "<SUF>",
                                            "\xE2\x96\x81<SUF>",
                                            "<|code_suffix|>",
                                            "<|suffix|>",
                                            NULL};
static const char *const FIM_MID_NAMES[] = {"<|fim_middle|>",
                                            "<fim-middle>",
                                            "<fim_middle>",
                                            "<\xEF\xBD\x9C"
                                            "fim\xE2\x96\x81"
                                            "end\xEF\xBD\x9C>",
                                            "<MID>",
                                            "\xE2\x96\x81<MID>",
                                            "<|code_middle|>",
                                            "<|middle|>",
                                            NULL};
static const char *const FIM_PAD_NAMES[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                            "<PAD>",       "[PAD]",     NULL};
static const char *const FIM_REP_NAMES[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>",       "<reponame>",    NULL};
static const char *const FIM_SEP_NAMES[] = {"<|file_sep|>", NULL};
static const char *const EOG_NAMES[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<|return|>",
                                        "<|call|>",
                                        "<|flush|>",
                                        "<|calls|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "</s>",
                                        "<|eom_id|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "[EOS]",
                                        "<|end_of_text|>",
                                        "<end_of_utterance>",
                                        "<eos>",
                                        "<turn|>",
                                        "<|tool_response>",
                                        "<\xEF\xBD\x9C"
                                        "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                                        "[e~[",
                                        NULL};

/* llama.cpp scans its token map in hash order and takes the first match; we
 * take the lowest id, which agrees whenever a vocab has one candidate. */
static void detect_by_name(tok_vocab *v, int32_t *id, const char *const *names) {
    if (*id >= 0) return;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (text_in(v, i, names)) {
            *id = i;
            v->attrs[i] |= TOK_ATTR_CONTROL; /* a control-looking token is control */
            return;
        }
    }
}

static void detect_specials(tok_vocab *v) {
    tok_specials *sp = &v->sp;
    detect_by_name(v, &sp->eot, EOT_NAMES);
    detect_by_name(v, &sp->eom, EOM_NAMES);
    detect_by_name(v, &sp->fim_pre, FIM_PRE_NAMES);
    detect_by_name(v, &sp->fim_suf, FIM_SUF_NAMES);
    detect_by_name(v, &sp->fim_mid, FIM_MID_NAMES);
    detect_by_name(v, &sp->fim_pad, FIM_PAD_NAMES);
    detect_by_name(v, &sp->fim_rep, FIM_REP_NAMES);
    detect_by_name(v, &sp->fim_sep, FIM_SEP_NAMES);
}

static void mark_eog(tok_vocab *v, int32_t id) {
    if (id >= 0 && id < v->n_tokens) v->eog[id] = 1;
}

/* Token id with the given text among the EOG tokens, or -1. */
static int32_t eog_with_text(const tok_vocab *v, const char *s) {
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (v->eog[i] && has_text(v, i, s)) return i;
    }
    return -1;
}

static void build_eog(tok_vocab *v) {
    const tok_specials *sp = &v->sp;
    mark_eog(v, sp->fim_pad);
    mark_eog(v, sp->fim_rep);
    mark_eog(v, sp->fim_sep);
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (text_in(v, i, EOG_NAMES)) {
            v->eog[i] = 1;
            v->attrs[i] |= TOK_ATTR_CONTROL;
        }
        /* gpt-oss: these structural tokens are always rendered */
        static const char *const GPT_OSS[] = {"<|channel|>", "<|message|>", "<|start|>",
                                              "<|constrain|>", NULL};
        if (text_in(v, i, GPT_OSS)) v->attrs[i] = TOK_ATTR_USER_DEFINED;
    }
    mark_eog(v, sp->eos);
    mark_eog(v, sp->eot);
    mark_eog(v, sp->eom);
    /* o200k_harmony / solar-open: <|end|> ends a message, not the generation */
    int32_t end = eog_with_text(v, "<|end|>");
    bool ret = eog_with_text(v, "<|return|>") >= 0, flush = eog_with_text(v, "<|flush|>") >= 0;
    bool call = eog_with_text(v, "<|call|>") >= 0 || eog_with_text(v, "<|calls|>") >= 0;
    if (end >= 0 && call && (ret || flush)) {
        v->eog[end] = 0;
        v->attrs[end] = TOK_ATTR_USER_DEFINED;
    }
    /* gemma4 / paddleocr: </s> is an ordinary token there */
    int32_t s_end = eog_with_text(v, "</s>");
    if (s_end >= 0 && eog_with_text(v, "<|tool_response>") >= 0) {
        v->eog[s_end] = 0;
        v->attrs[s_end] = TOK_ATTR_NORMAL;
    }
}

/* Tokens that split raw text, longest first (ties by id, for determinism). */
typedef struct len_id {
    uint32_t len;
    int32_t id;
} len_id;

static int cmp_len_id(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static bool build_special_list(tok_vocab *v) {
    const uint16_t want = TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN;
    int32_t n = 0;
    for (int32_t i = 0; i < v->n_tokens; i++) n += (v->attrs[i] & want) != 0;
    len_id *tmp = malloc(((size_t)n + 1) * sizeof *tmp);
    v->special_ids = malloc(((size_t)n + 1) * sizeof *v->special_ids);
    if (!tmp || !v->special_ids) {
        free(tmp);
        return false;
    }
    n = 0;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (v->attrs[i] & want) tmp[n++] = (len_id){v->str.len[i], i};
    }
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_len_id);
    for (int32_t i = 0; i < n; i++) v->special_ids[i] = tmp[i].id;
    v->n_special = n;
    free(tmp);
    return true;
}

/* Phi-3 models strip whitespace after most special tokens (by general.name). */
static void apply_model_rules(tok_vocab *v, const gguf_file *f) {
    char name[256] = "";
    gguf_get_str_buf(f, "general.name", name, sizeof name);
    for (char *p = name; *p; p++) *p = (char)tolower((unsigned char)*p);
    if (!strstr(name, "phi-3") && !strstr(name, "phi3")) return;
    for (int32_t i = 0; i < v->n_special; i++) v->attrs[v->special_ids[i]] |= TOK_ATTR_RSTRIP;
    static const char *const KEEP[] = {"<unk>", "<s>", "<|endoftext|>", NULL};
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (has_text(v, i, "</s>")) v->attrs[i] |= TOK_ATTR_RSTRIP;
        if (text_in(v, i, KEEP)) v->attrs[i] &= (uint16_t)~TOK_ATTR_RSTRIP;
    }
}

bool tok_load_specials(tok_vocab *v, const gguf_file *f, kvl_error *err) {
    set_defaults(v);
    read_ids(v, f);
    if (!read_flags(v, f, err)) return false;
    detect_specials(v);
    build_eog(v);
    if (!build_special_list(v)) return kvl_fail(err, "tokenizer: out of memory");
    apply_model_rules(v, f);
    return true;
}
