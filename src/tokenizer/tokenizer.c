/* Public tokenizer API (tokenizer.h): encoding with llama.cpp's special-token
 * partitioning, per-token decoding and the streaming UTF-8 detokenizer. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>

#include "tok_extra.h"
#include "tok_internal.h"
#include "tok_unicode.h"

/* ---------------------------------------------------------------- queries */

int32_t tok_n_vocab(const tok_vocab *v) { return v->n_tokens; }
uint64_t tok_vocab_uid(const tok_vocab *v) { return v->uid; }
int32_t tok_bos(const tok_vocab *v) { return v->sp.bos; }
int32_t tok_eos(const tok_vocab *v) { return v->sp.eos; }
int32_t tok_eot(const tok_vocab *v) { return v->sp.eot; }
tok_fim tok_fim_ids(const tok_vocab *v) {
    return (tok_fim){v->sp.fim_pre, v->sp.fim_suf, v->sp.fim_mid,
                     v->sp.fim_pad, v->sp.fim_rep, v->sp.fim_sep};
}
bool tok_add_bos(const tok_vocab *v) { return v->add_bos; }
bool tok_add_eos(const tok_vocab *v) { return v->add_eos; }
bool tok_add_sep(const tok_vocab *v) { return v->add_sep; }
int32_t tok_sep(const tok_vocab *v) { return v->sp.sep; }
const char *tok_model_name(const tok_vocab *v) { return v->model; }
const char *tok_pre_name(const tok_vocab *v) { return v->pre; }

static bool valid_id(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n_tokens; }

bool tok_is_eog(const tok_vocab *v, int32_t id) { return valid_id(v, id) && v->eog[id]; }

bool tok_is_control(const tok_vocab *v, int32_t id) {
    return valid_id(v, id) && (v->attrs[id] & TOK_ATTR_CONTROL);
}

const char *tok_piece(const tok_vocab *v, int32_t id) {
    return valid_id(v, id) ? v->str.s[id] : "";
}

int32_t tok_token_id(const tok_vocab *v, const char *text, size_t len) {
    return tok_text_to_token(v, text, len);
}

/* ---------------------------------------------------------------- partition */

/* A piece of the input: raw text, or a special token found in it. */
typedef struct frag {
    int32_t id; /* -1: raw text */
    size_t off, len;
} frag;

typedef struct fragvec {
    frag *v;
    size_t n, cap;
} fragvec;

static bool frag_push(fragvec *a, int32_t id, size_t off, size_t len) {
    if (!kvl_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v, 16)) return false;
    a->v[a->n++] = (frag){id, off, len};
    return true;
}

/* isspace() in the C locale, which llama.cpp's strip rules use. */
static bool c_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static const char *find_in(const char *text, const frag *f, size_t from, const char *s, size_t n) {
    size_t end = f->off + f->len;
    return from < end ? memmem(text + from, end - from, s, n) : NULL;
}

/* Byte ranges of the text where control tokens are not recognised (sorted,
 * not overlapping): text a caller supplied, inside text it wrote. */
typedef struct guards {
    const tok_span *v;
    size_t n;
} guards;

static bool is_guarded_token(const tok_vocab *v, int32_t id) {
    return (v->attrs[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)) != 0;
}

/* Whether [at, at + n) overlaps a guarded range (binary search). */
static bool overlaps_guard(const guards *g, size_t at, size_t n) {
    size_t lo = 0, hi = g ? g->n : 0;
    while (lo < hi) { /* the first range ending after `at` */
        size_t mid = lo + (hi - lo) / 2;
        if (g->v[mid].off + g->v[mid].len <= at) lo = mid + 1;
        else hi = mid;
    }
    return g && lo < g->n && g->v[lo].off < at + n;
}

/* The next occurrence of token id in f from pos that may become the token. */
static const char *next_match(const tok_vocab *v, const char *text, const frag *f, size_t pos,
                              int32_t id, const guards *g) {
    const char *s = v->str.s[id];
    const size_t n = v->str.len[id];
    const bool check = g && g->n && is_guarded_token(v, id);
    for (const char *m; (m = find_in(text, f, pos, s, n)) != NULL; pos = (size_t)(m - text) + 1)
        if (!check || !overlaps_guard(g, (size_t)(m - text), n)) return m;
    return NULL;
}

/* Splits raw fragment f at every occurrence of special token id, leftmost
 * first, applying the token's LSTRIP/RSTRIP to the text beside it. */
static bool split_at(const tok_vocab *v, const char *text, const frag *f, int32_t id,
                     const guards *g, fragvec *out) {
    const size_t n = v->str.len[id], end = f->off + f->len;
    size_t pos = f->off;
    bool ok = true;
    for (const char *m; ok && (m = next_match(v, text, f, pos, id, g)) != NULL;) {
        size_t at = (size_t)(m - text), left = at - pos;
        if (v->attrs[id] & TOK_ATTR_LSTRIP)
            while (left > 0 && c_space(text[pos + left - 1])) left--;
        ok = (left == 0 || frag_push(out, -1, pos, left)) && frag_push(out, id, 0, 0);
        pos = at + n;
        if (v->attrs[id] & TOK_ATTR_RSTRIP)
            while (pos < end && c_space(text[pos])) pos++;
    }
    return ok && (pos >= end || frag_push(out, -1, pos, end - pos));
}

static bool occurs(const tok_vocab *v, const char *text, const fragvec *fr, int32_t id,
                   const guards *g) {
    for (size_t i = 0; i < fr->n; i++) {
        if (fr->v[i].id < 0 && next_match(v, text, &fr->v[i], fr->v[i].off, id, g)) return true;
    }
    return false;
}

/* llama.cpp's tokenizer_st_partition: special tokens, longest first, cut the
 * raw text; control and unknown tokens only when parse_special is set, while
 * user-defined tokens always do. */
static bool partition(const tok_vocab *v, const char *text, size_t len, bool parse_special,
                      const guards *g, fragvec *fr) {
    fragvec next = {0};
    bool ok = len == 0 || frag_push(fr, -1, 0, len);
    for (int32_t k = 0; ok && k < v->n_special; k++) {
        int32_t id = v->special_ids[k];
        if (!parse_special && (v->attrs[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
        if (!occurs(v, text, fr, id, g)) continue;
        next.n = 0;
        for (size_t i = 0; ok && i < fr->n; i++) {
            const frag *f = &fr->v[i];
            ok = f->id >= 0 ? frag_push(&next, f->id, 0, 0) : split_at(v, text, f, id, g, &next);
        }
        fragvec tmp = *fr;
        *fr = next;
        next = tmp;
    }
    free(next.v);
    return ok;
}

/* ---------------------------------------------------------------- encode */

/* SPM text: a leading space where llama.cpp adds one, spaces as U+2581. */
static bool spm_fragment(const tok_vocab *v, const char *text, size_t len, bool prefix,
                         tok_i32vec *out) {
    char *buf = malloc(len * 3 + 4);
    if (!buf) return false;
    size_t n = 0;
    if (prefix) {
        memcpy(buf, "\xE2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, "\xE2\x96\x81", 3);
            n += 3;
        } else {
            buf[n++] = text[i];
        }
    }
    bool ok = tok_spm_encode(v, buf, n, out);
    free(buf);
    return ok;
}

static bool encode_fragments(const tok_vocab *v, const char *text, const fragvec *fr,
                             tok_i32vec *ids, kvl_error *err) {
    bool prev_special = true; /* SPM: the first raw text gets the leading space */
    for (size_t i = 0; i < fr->n; i++) {
        const frag *f = &fr->v[i];
        bool ok;
        if (f->id >= 0) {
            ok = tok_i32vec_push(ids, f->id);
            prev_special = true;
        } else if (v->kind == TOK_KIND_SPM) {
            ok = spm_fragment(v, text + f->off, f->len, v->add_space_prefix && prev_special, ids);
            prev_special = false;
        } else {
            ok = tok_bpe_encode(v, text + f->off, f->len, ids, err);
        }
        if (!ok) return err && err->msg[0] ? false : kvl_fail(err, "tokenizer: out of memory");
    }
    return true;
}

static int64_t encode(const tok_vocab *v, const char *text, size_t len, bool add_bos,
                      bool parse_special, const guards *g, int32_t *out, int64_t cap,
                      kvl_error *err) {
    if (err) err->msg[0] = '\0';
    if (!text && len) {
        kvl_fail(err, "tokenizer: NULL text");
        return -1;
    }
    fragvec fr = {0};
    tok_i32vec ids = {0};
    bool ok = (!add_bos || v->sp.bos < 0 || tok_i32vec_push(&ids, v->sp.bos)) &&
              partition(v, text, len, parse_special, g, &fr);
    if (!ok) kvl_fail(err, "tokenizer: out of memory");
    ok = ok && encode_fragments(v, text, &fr, &ids, err);
    int64_t n = ok ? (int64_t)ids.n : -1;
    for (int64_t i = 0; ok && i < n && i < cap; i++) out[i] = ids.v[i];
    free(fr.v);
    free(ids.v);
    return n;
}

int64_t tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_bos,
                   bool parse_special, int32_t *out, int64_t cap, kvl_error *err) {
    return encode(v, text, len, add_bos, parse_special, NULL, out, cap, err);
}

int64_t tok_encode_guarded(const tok_vocab *v, const char *text, size_t len, bool add_bos,
                           const tok_span *guard, size_t n_guard, int32_t *out, int64_t cap,
                           kvl_error *err) {
    for (size_t i = 0; i < n_guard; i++)
        if (guard[i].off > len || guard[i].len > len - guard[i].off ||
            (i > 0 && guard[i].off < guard[i - 1].off + guard[i - 1].len)) {
            kvl_fail(err, "tokenizer: guarded range %zu is out of order or past the text", i);
            return -1;
        }
    const guards g = {guard, n_guard};
    return encode(v, text, len, add_bos, true, &g, out, cap, err);
}

int32_t *tok_encode_alloc(const tok_vocab *v, const char *text, size_t len, bool add_bos,
                          bool parse_special, const tok_span *guard, size_t n_guard, int64_t *n,
                          kvl_error *err) {
    /* A first guess of one id per byte can be short (byte-level BPE spells an
     * invalid UTF-8 byte as several tokens): the count the first call returns
     * sizes the second. */
    int64_t cap = (int64_t)len + 8;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *ids = malloc((size_t)cap * sizeof *ids);
        if (!ids) {
            kvl_fail(err, "tokenizer: out of memory for %lld token ids", (long long)cap);
            return NULL;
        }
        int64_t got = guard
                          ? tok_encode_guarded(v, text, len, add_bos, guard, n_guard, ids, cap, err)
                          : tok_encode(v, text, len, add_bos, parse_special, ids, cap, err);
        if (got >= 0 && got <= cap) {
            *n = got;
            return ids;
        }
        free(ids);
        if (got < 0) return NULL;
        cap = got;
    }
    kvl_fail(err, "tokenizer: the count of ids changed between two calls on the same text");
    return NULL;
}

int32_t tok_n_special(const tok_vocab *v) { return v->n_special; }
int32_t tok_special_id(const tok_vocab *v, int32_t k) {
    return k >= 0 && k < v->n_special ? v->special_ids[k] : -1;
}
bool tok_is_parse_special(const tok_vocab *v, int32_t id) {
    return valid_id(v, id) && is_guarded_token(v, id);
}

/* ---------------------------------------------------------------- decode */

typedef struct charbuf {
    char *v;
    size_t n, cap;
} charbuf;

static bool cb_put(charbuf *b, const void *s, size_t n) {
    if (!kvl_grow((void **)&b->v, &b->cap, b->n + n, 1, 4096)) return false;
    memcpy(b->v + b->n, s, n);
    b->n += n;
    return true;
}

/* BPE text back to bytes; a character that stands for no byte is written as
 * llama.cpp writes it: [UNK_BYTE_0x<its utf-8 in hex><the whole token>]. */
static bool bpe_piece(const char *s, size_t len, charbuf *b) {
    bool ok = true;
    for (size_t off = 0; ok && off < len;) {
        uint32_t cp = tok_utf8_next(s, len, &off);
        int byte = tok_cp_to_byte(cp);
        if (byte >= 0) {
            char c = (char)byte;
            ok = cb_put(b, &c, 1);
            continue;
        }
        char u[4], hex[16];
        size_t un = tok_utf8_put(cp, u);
        ok = cb_put(b, "[UNK_BYTE_0x", 12);
        for (size_t k = 0; ok && k < un; k++) {
            snprintf(hex, sizeof hex, "%02x", (unsigned char)u[k]);
            ok = cb_put(b, hex, 2);
        }
        ok = ok && cb_put(b, s, len) && cb_put(b, "]", 1);
    }
    return ok;
}

/* SPM text back to bytes: U+2581 is a space. */
static bool spm_piece(const char *s, size_t len, charbuf *b) {
    bool ok = true;
    for (size_t i = 0; ok && i < len;) {
        if (len - i >= 3 && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
            ok = cb_put(b, " ", 1);
            i += 3;
        } else {
            ok = cb_put(b, s + i, 1);
            i++;
        }
    }
    return ok;
}

/* A byte token "<0xNN>": the byte is read from its hex digits. */
static bool byte_piece(const char *s, size_t len, charbuf *b) {
    int val = 0;
    for (size_t i = 3; i < 5 && i < len && kvl_hex_digit(s[i]) >= 0; i++)
        val = val * 16 + kvl_hex_digit(s[i]);
    char c = (char)val;
    return cb_put(b, &c, 1);
}

/* The bytes of token id with special = true (llama.cpp's piece cache). */
static bool token_piece(const tok_vocab *v, int32_t id, charbuf *b) {
    const uint16_t a = v->attrs[id];
    const char *s = v->str.s[id];
    const size_t len = v->str.len[id];
    if (a & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED)) return cb_put(b, s, len);
    if (a & TOK_ATTR_NORMAL) /* gemma4 pieces are SentencePiece-style text */
        return v->kind == TOK_KIND_SPM || v->spm_pieces ? spm_piece(s, len, b)
                                                        : bpe_piece(s, len, b);
    if (a & TOK_ATTR_BYTE) return byte_piece(s, len, b);
    return true; /* unused / undefined tokens decode to nothing */
}

bool tok_build_pieces(tok_vocab *v) {
    charbuf b = {0};
    bool ok = true;
    for (int32_t i = 0; ok && i < v->n_tokens; i++) {
        v->piece_off[i] = b.n;
        ok = token_piece(v, i, &b);
        v->piece_len[i] = (uint32_t)(b.n - v->piece_off[i]);
    }
    v->pieces = b.v;
    return ok;
}

/* Bytes of id for output; empty for unknown/control tokens unless special. */
static size_t piece_bytes(const tok_vocab *v, int32_t id, bool special, const char **p) {
    *p = "";
    if (!valid_id(v, id)) return 0;
    if (!special && (v->attrs[id] & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL))) return 0;
    *p = v->pieces + v->piece_off[id];
    return v->piece_len[id];
}

size_t tok_token_bytes(const tok_vocab *v, int32_t id, bool special, char *buf, size_t cap) {
    const char *p;
    size_t n = piece_bytes(v, id, special, &p);
    if (buf && cap) memcpy(buf, p, n < cap ? n : cap);
    return n;
}

/* ---------------------------------------------------------------- streaming */

void tok_stream_init(tok_stream *s) { memset(s, 0, sizeof *s); }

enum { UTF8_VALID = 1, UTF8_INCOMPLETE = 0, UTF8_INVALID = -1 };

/* Classifies the sequence at p (strict UTF-8: no overlongs, surrogates or values
 * past U+10FFFF). *len: its length, the bytes seen so far if incomplete, or the
 * maximal invalid subpart that one U+FFFD replaces. */
static int utf8_scan(const unsigned char *p, size_t avail, size_t *len) {
    const unsigned b = p[0];
    unsigned lo = 0x80, hi = 0xBF;
    size_t need;
    *len = 1;
    if (b < 0x80) return UTF8_VALID;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        lo = b == 0xE0 ? 0xA0 : 0x80;
        hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        lo = b == 0xF0 ? 0x90 : 0x80;
        hi = b == 0xF4 ? 0x8F : 0xBF;
    } else {
        return UTF8_INVALID;
    }
    for (size_t k = 1; k < need; k++) {
        *len = k;
        if (k >= avail) return UTF8_INCOMPLETE;
        const unsigned c = p[k];
        if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return UTF8_INVALID;
    }
    *len = need;
    return UTF8_VALID;
}

/* Appends n bytes if they fit; once something does not fit nothing more is
 * written, so the output stays a prefix of the text. */
static void out_put(char *out, size_t cap, size_t *w, bool *full, const void *s, size_t n) {
    if (*full || *w + n > cap) {
        *full = true;
        return;
    }
    memcpy(out + *w, s, n);
    *w += n;
}

size_t tok_stream_push(tok_stream *s, const tok_vocab *v, int32_t id, bool special, char *out,
                       size_t cap) {
    const char *piece;
    const size_t plen = piece_bytes(v, id, special, &piece);
    const size_t total = (size_t)s->n_pending + plen;
    unsigned char stackbuf[512];
    unsigned char *buf = total <= sizeof stackbuf ? stackbuf : malloc(total);
    if (!buf) return 0;
    memcpy(buf, s->pending, (size_t)s->n_pending);
    memcpy(buf + s->n_pending, piece, plen);
    s->n_pending = 0;
    size_t w = 0;
    bool full = false;
    for (size_t i = 0, len; i < total; i += len) {
        int st = utf8_scan(buf + i, total - i, &len);
        if (st == UTF8_INCOMPLETE) { /* at most 3 bytes: wait for the rest */
            memcpy(s->pending, buf + i, total - i);
            s->n_pending = (int)(total - i);
            break;
        }
        if (st == UTF8_VALID) out_put(out, cap, &w, &full, buf + i, len);
        else out_put(out, cap, &w, &full, "\xEF\xBF\xBD", 3);
    }
    if (buf != stackbuf) free(buf);
    return w;
}

size_t tok_stream_flush(tok_stream *s, char *out, size_t cap) {
    size_t w = 0;
    if (s->n_pending > 0 && cap >= 3) {
        memcpy(out, "\xEF\xBF\xBD", 3);
        w = 3;
    }
    s->n_pending = 0;
    return w;
}
