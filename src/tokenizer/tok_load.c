/* Loading a vocabulary from GGUF metadata (tokenizer.ggml.*), following what
 * llama.cpp's llama_vocab::load does, so that every later decision (which
 * tokens split the text, which ids end generation) is the same as there. */
#include <stdatomic.h>
#include <stdio.h>

#include "tok_internal.h"
#include "tok_unicode.h"

#define KEY_MODEL  "tokenizer.ggml.model"
#define KEY_PRE    "tokenizer.ggml.pre"
#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_SCORES "tokenizer.ggml.scores"
#define KEY_TYPES  "tokenizer.ggml.token_type"
#define KEY_MERGES "tokenizer.ggml.merges"

/* GGUF token types (llama_token_type) -> attribute bits. */
static uint16_t attr_of_type(int64_t t) {
    switch (t) {
    case 1: return TOK_ATTR_NORMAL;
    case 2: return TOK_ATTR_UNKNOWN;
    case 3: return TOK_ATTR_CONTROL;
    case 4: return TOK_ATTR_USER_DEFINED;
    case 5: return TOK_ATTR_UNUSED;
    case 6: return TOK_ATTR_BYTE;
    default: return TOK_ATTR_UNDEFINED;
    }
}

static bool read_model(tok_vocab *v, const gguf_file *f, kvl_error *err) {
    if (!gguf_get_str_buf(f, KEY_MODEL, v->model, sizeof v->model))
        return kvl_fail(err, "%s: tokenizer: missing or non-string '%s'", gguf_path(f), KEY_MODEL);
    if (strcmp(v->model, "llama") == 0) {
        v->kind = TOK_KIND_SPM;
    } else if (strcmp(v->model, "gpt2") == 0 || strcmp(v->model, "gemma4") == 0) {
        v->kind = TOK_KIND_BPE;
    } else {
        return kvl_fail(
            err, "%s: tokenizer: unsupported tokenizer model '%s' (supported: llama, gpt2, gemma4)",
            gguf_path(f), v->model);
    }
    if (strcmp(v->model, "gemma4") == 0) {
        /* llama.cpp takes the pre-tokenizer from the model name here, whatever
         * tokenizer.ggml.pre says (Gemma 4 files do not write it). */
        snprintf(v->pre, sizeof v->pre, "gemma4");
        return true;
    }
    if (!gguf_get_str_buf(f, KEY_PRE, v->pre, sizeof v->pre) || !v->pre[0]) {
        if (v->kind == TOK_KIND_BPE)
            kvl_log(KVL_LOG_WARN,
                    "%s: missing tokenizer.ggml.pre, using 'default' (quality may suffer)",
                    gguf_path(f));
        snprintf(v->pre, sizeof v->pre, "default");
    }
    return true;
}

/* An optional array of at least n 32-bit numbers of type t1 or t2: *data is
 * NULL when the key is absent, false (with err) when it is there but unusable. */
static bool get_num_array(const gguf_file *f, const char *key, int64_t n, gguf_vtype t1,
                          gguf_vtype t2, gguf_vtype *t, const void **data, kvl_error *err) {
    *data = NULL;
    if (gguf_find_key(f, key) < 0) return true;
    uint64_t count;
    if (!gguf_get_arr(f, key, t, &count, data) || (*t != t1 && *t != t2))
        return kvl_fail(err, "%s: tokenizer: '%s' has the wrong type", gguf_path(f), key);
    if (count < (uint64_t)n)
        return kvl_fail(err, "%s: tokenizer: '%s' has %llu entries for %lld tokens", gguf_path(f),
                        key, (unsigned long long)count, (long long)n);
    return true;
}

/* Element i of such an array, as its raw 32 bits (the data need not be aligned). */
static uint32_t word_at(const void *data, int32_t i) {
    uint32_t w;
    memcpy(&w, (const char *)data + 4 * (size_t)i, 4);
    return w;
}

/* The per-token arrays, zeroed, in one block. */
static bool alloc_per_token(tok_vocab *v) {
    const size_t n = (size_t)v->n_tokens;
    const kvl_part parts[] = {KVL_PART(v->piece_off, n), KVL_PART(v->scores, n),
                              KVL_PART(v->piece_len, n), KVL_PART(v->attrs, n),
                              KVL_PART(v->eog, n)};
    v->per_token = KVL_ALLOC_PARTS(parts);
    return v->per_token != NULL;
}

static bool read_scores_and_types(tok_vocab *v, const gguf_file *f, kvl_error *err) {
    const int32_t n = v->n_tokens;
    if (!alloc_per_token(v)) return kvl_fail(err, "tokenizer: out of memory");
    gguf_vtype t;
    const void *scores, *types;
    if (!get_num_array(f, KEY_SCORES, n, GGUF_VT_FLOAT32, GGUF_VT_INT32, &t, &scores, err))
        return false;
    for (int32_t i = 0; scores && i < n; i++) {
        uint32_t bits = word_at(scores, i);
        if (t == GGUF_VT_FLOAT32) {
            memcpy(&v->scores[i], &bits, 4);
        } else {
            v->scores[i] = (float)(int32_t)bits;
        }
    }
    if (!get_num_array(f, KEY_TYPES, n, GGUF_VT_INT32, GGUF_VT_INT32, &t, &types, err))
        return false;
    for (int32_t i = 0; i < n; i++)
        v->attrs[i] = types ? attr_of_type((int32_t)word_at(types, i)) : TOK_ATTR_NORMAL;
    return true;
}

/* Token strings and merge halves, with their total size (for the arena). */
typedef struct merge_half {
    const char *s;
    size_t len;
} merge_half;

/* Splits a merge line at its first space after position 0, as llama.cpp does;
 * a line without one yields two empty halves. */
static void split_merge(const char *s, size_t len, merge_half *a, merge_half *b) {
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (!sp) {
        a->s = b->s = "";
        a->len = b->len = 0;
        return;
    }
    a->s = s;
    a->len = (size_t)(sp - s);
    b->s = sp + 1;
    b->len = len - a->len - 1;
}

static bool count_strings(const gguf_file *f, int64_t n_tok, uint64_t n_merges, size_t *bytes,
                          kvl_error *err) {
    size_t total = 0;
    for (int64_t i = 0; i < n_tok; i++) {
        const char *s;
        size_t len;
        if (!gguf_get_arr_str(f, KEY_TOKENS, (uint64_t)i, &s, &len))
            return kvl_fail(err, "%s: tokenizer: cannot read token %lld", gguf_path(f),
                            (long long)i);
        total += (len ? len : 32) + 1; /* room for "[EMPTY_i]" */
    }
    for (uint64_t i = 0; i < n_merges; i++) {
        const char *s;
        size_t len;
        if (!gguf_get_arr_str(f, KEY_MERGES, i, &s, &len))
            return kvl_fail(err, "%s: tokenizer: cannot read merge %llu", gguf_path(f),
                            (unsigned long long)i);
        total += len + 2;
    }
    *bytes = total;
    return true;
}

/* Room for max strings of `bytes` in all (their NULs included): the pointer
 * and length arrays and the arena in one block, owned by s. */
static bool strings_init(tok_strings *t, size_t max, size_t bytes) {
    const kvl_part parts[] = {KVL_PART(t->s, max), KVL_PART(t->len, max),
                              KVL_PART(t->arena, bytes)};
    if (!KVL_ALLOC_PARTS(parts)) return false;
    return tok_strmap_init(&t->ids, max);
}

static void strings_free(tok_strings *t) {
    kvl_free(t->s); /* the lengths and the arena with it */
    tok_strmap_free(&t->ids);
}

/* Copies s into the arena as the next string id (not yet in the map). */
static int32_t strings_add(tok_strings *t, const char *s, size_t len) {
    char *dst = t->arena + t->used;
    memcpy(dst, s, len);
    dst[len] = '\0';
    t->s[t->n] = dst;
    t->len[t->n] = (uint32_t)len;
    t->used += len + 1;
    return t->n++;
}

static bool load_tokens(tok_vocab *v, const gguf_file *f, kvl_error *err) {
    for (int32_t i = 0; i < v->n_tokens; i++) {
        const char *s;
        size_t len;
        gguf_get_arr_str(f, KEY_TOKENS, (uint64_t)i, &s, &len);
        char empty[32];
        if (len == 0) { /* llama.cpp renames empty tokens so they stay distinct */
            len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%d]", (int)i);
            s = empty;
            kvl_log(KVL_LOG_WARN, "%s: empty token at index %d", gguf_path(f), (int)i);
        }
        if (len > UINT32_MAX / 2)
            return kvl_fail(err, "%s: token %d too long", gguf_path(f), (int)i);
        tok_strings *t = &v->str;
        int32_t dup = tok_strmap_put(&t->ids, t->s, t->len, strings_add(t, s, len));
        if (dup >= 0)
            return kvl_fail(err, "%s: tokenizer: duplicate token '%s' has ids %d and %d",
                            gguf_path(f), t->s[i], (int)dup, (int)i);
    }
    return true;
}

/* Interned id of a merge half, adding it if it is not a token. */
static int32_t intern(tok_vocab *v, const merge_half *h) {
    int32_t id = tok_str_id(v, h->s, h->len);
    if (id >= 0) return id;
    id = strings_add(&v->str, h->s, h->len);
    tok_strmap_put(&v->str.ids, v->str.s, v->str.len, id);
    return id;
}

static bool load_merges(tok_vocab *v, const gguf_file *f, uint64_t n_merges, kvl_error *err) {
    if (!tok_pairmap_init(&v->merges, n_merges)) return kvl_fail(err, "tokenizer: out of memory");
    for (uint64_t i = 0; i < n_merges; i++) {
        const char *s;
        size_t len;
        gguf_get_arr_str(f, KEY_MERGES, i, &s, &len);
        merge_half a, b;
        split_merge(s, len, &a, &b);
        int32_t ia = intern(v, &a);
        int32_t ib = intern(v, &b);
        tok_pairmap_put_first(&v->merges, ia, ib, (int32_t)(i > INT32_MAX ? INT32_MAX : i));
    }
    return true;
}

static bool load_strings(tok_vocab *v, const gguf_file *f, kvl_error *err) {
    gguf_vtype t;
    uint64_t n_tok = 0, n_merges = 0;
    if (!gguf_get_arr(f, KEY_TOKENS, &t, &n_tok, NULL) || t != GGUF_VT_STRING)
        return kvl_fail(err, "%s: tokenizer: missing or non-string-array '%s'", gguf_path(f),
                        KEY_TOKENS);
    if (n_tok == 0 || n_tok > INT32_MAX / 4)
        return kvl_fail(err, "%s: tokenizer: bad token count %llu", gguf_path(f),
                        (unsigned long long)n_tok);
    if (v->kind == TOK_KIND_BPE) {
        if (!gguf_get_arr(f, KEY_MERGES, &t, &n_merges, NULL))
            return kvl_fail(err, "%s: tokenizer: BPE vocab without '%s'", gguf_path(f), KEY_MERGES);
        if (t != GGUF_VT_STRING || n_merges > INT32_MAX / 4)
            return kvl_fail(err, "%s: tokenizer: bad '%s'", gguf_path(f), KEY_MERGES);
    }
    v->n_tokens = (int32_t)n_tok;
    size_t bytes = 0, max_strs = (size_t)n_tok + 2 * (size_t)n_merges;
    if (!count_strings(f, (int64_t)n_tok, n_merges, &bytes, err)) return false;
    if (!strings_init(&v->str, max_strs, bytes + 1))
        return kvl_fail(err, "tokenizer: out of memory");
    if (!load_tokens(v, f, err)) return false;
    return v->kind != TOK_KIND_BPE || load_merges(v, f, n_merges, err);
}

/* Byte fallback tables: SPM's <0xNN> tokens (or raw bytes), gemma4's <0xNN>
 * tokens only, byte-level BPE's byte-to-character map. */
static void build_byte_tables(tok_vocab *v) {
    for (int b = 0; b < 256; b++) {
        char hex[8];
        int n = snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = tok_text_to_token(v, hex, (size_t)n);
        v->hex_tok[b] = id;
        if (id < 0) {
            char raw = (char)b;
            id = tok_text_to_token(v, &raw, 1);
        }
        v->byte_tok[b] = id;
        v->gpt2_len[b] = (uint8_t)tok_utf8_put(tok_byte_to_cp((uint8_t)b), v->gpt2_chr[b]);
    }
}

static bool setup_pretok(tok_vocab *v, kvl_error *err) {
    /* llama.cpp defaults before the GGUF overrides. */
    v->add_bos = v->kind == TOK_KIND_SPM;
    v->add_space_prefix = v->kind == TOK_KIND_SPM;
    if (v->kind != TOK_KIND_BPE) return true;
    tok_pre_info info;
    v->pretok = tok_pretok_create(v->pre, &info, err);
    if (!v->pretok) return false;
    v->ignore_merges = info.ignore_merges;
    v->add_bos = info.add_bos;
    v->pre_no_bos = info.no_bos;
    v->spm_pieces = info.spm_pieces;
    v->newline_words = info.newline_words;
    v->force_bos = info.force_bos;
    return true;
}

/* The loading steps in order; false (with err) at the first that fails. */
static bool load(tok_vocab *v, const gguf_file *f, kvl_error *err) {
    if (!read_model(v, f, err) || !load_strings(v, f, err) || !read_scores_and_types(v, f, err))
        return false;
    build_byte_tables(v);
    return setup_pretok(v, err) && tok_load_specials(v, f, err) &&
           (tok_build_pieces(v) || kvl_fail(err, "tokenizer: out of memory"));
}

tok_vocab *tok_vocab_create(const gguf_file *f, kvl_error *err) {
    if (!f) {
        kvl_fail(err, "tokenizer: no GGUF file");
        return NULL;
    }
    tok_vocab *v = calloc(1, sizeof *v);
    static atomic_uint_fast64_t next_uid;
    if (v) v->uid = atomic_fetch_add(&next_uid, 1) + 1;
    if (!v) {
        kvl_fail(err, "tokenizer: out of memory");
        return NULL;
    }
    if (load(v, f, err)) return v;
    tok_vocab_destroy(v);
    return NULL;
}

void tok_vocab_destroy(tok_vocab *v) {
    if (!v) return;
    tok_pretok_destroy(v->pretok);
    strings_free(&v->str);
    tok_pairmap_free(&v->merges);
    kvl_free(v->per_token);
    free(v->pieces);
    free(v->special_ids);
    free(v);
}
