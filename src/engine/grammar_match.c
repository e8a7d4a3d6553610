/* grammar matching and token masks. See grammar.h.
 *
 * A matcher position is a set of stacks. A stack lists element positions:
 * its top is the code-point set to match next, the entries below are where to
 * go on when the rule above finishes (a reference that ends its alternative
 * pushes nothing: tail calls keep `x ::= [a-z] x | ` at constant depth). The
 * empty stack means the grammar may end here. A partial UTF-8 sequence read so
 * far is part of the position too.
 *
 * Positions are interned per grammar_state into numbered states, each with a
 * lazily filled 256-entry byte transition table, so that after the first few
 * steps a mask walk over the vocabulary trie costs one table load per trie
 * node it visits. */
#include "grammar_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- states -- */

/* A state key: [partial value, remaining | length << 4, n_stacks, then per
 * stack: its length and its positions, bottom first], stacks sorted. */
enum { K_PVAL = 0, K_PREM = 1, K_NST = 2, K_HDR = 3 };
enum { T_UNKNOWN = -2, T_DEAD = -1 };
#define P_UNIFORM 0x100 /* in key[K_PREM]: a partial code point whose bits no longer matter */
enum { T_OVER = -3 };   /* a bound was exceeded: st->fail says which (never cached as refusal) */
#define STATE_SOFT_LIMIT 4096      /* states kept between steps; the cache restarts past it */
#define STATE_SOFT_WORDS (1 << 22) /* or when their keys take more words than this (16 MiB) */
/* expand() recurses once per reference it enters and per rule end it pops: a
 * chain of thousands of nullable items (("a")?{0,9000}) would exhaust the
 * thread's stack. Past GRAMMAR_MAX_EXPAND_DEPTH the state fails with an error
 * (grammar_compile refuses a grammar whose start already does). Each level
 * holds a 64-word buffer: 4096 levels stay near 1.5 MiB. */
#define MASK_MEMO 4

/* A slot of the set of (stack, position) pairs met this round (see seen_keys). */
typedef struct seen_slot {
    int64_t at;   /* 1 + the offset of its record in seen_keys, 0: empty */
    uint32_t gen; /* the round that wrote it: a slot of another round reads as empty */
} seen_slot;

typedef struct srec {
    int64_t key_off;
    int32_t key_len;
    uint32_t hash;
    bool can_end, must_end;
} srec;

struct grammar_state {
    const grammar *g;
    int32_t *keys;
    int64_t n_keys;
    size_t cap_keys;
    srec *st;
    int32_t n_st, cap_st;
    int32_t *trans; /* [cap_st][256] byte transitions, T_UNKNOWN until computed */
    int32_t *ht;    /* state ids, -1 empty; size ht_cap (a power of two) */
    uint32_t ht_cap;
    int32_t cur;
    /* scratch: stacks being built ([len, positions...] records) and their order */
    int32_t *out;
    int64_t n_out;
    size_t cap_out;
    int64_t *recs;
    int64_t n_recs;
    size_t cap_recs;
    int32_t *walk; /* per trie depth */
    /* the last masks by the state they were computed in: inside a string the
     * state after each token is the same, so its mask is the same too */
    struct {
        int32_t state, n_vocab, count;
        uint32_t *bits;
    } memo[MASK_MEMO];
    int memo_next;
    int overflow; /* this round's bound exceeded (a G_* reason), 0: none */
    int fail;     /* sticky: a bound was exceeded, the state answers nothing more */
    char fail_msg[200];
    int32_t max_stacks; /* the bounds (grammar.h), lowered by tests */
    int64_t max_work, work;
    int64_t n_bytes; /* accepted so far */
    int64_t at_byte; /* the byte being read (1-based), for the error message */
    int32_t depth;   /* expand()'s recursion */
    /* The (stack, position) pairs expand() has met since scratch_reset, as
     * records [len, stack..., pos] in seen_keys, found through the hash table
     * seen (a slot counts only when its gen is this round's). Two epsilon
     * paths that reach the same pair emit the same stacks, so the second is
     * cut: without it k adjacent items that can each be empty two ways
     * ("" [b-d]* ?{73}: the option empty, or the star empty) are expanded
     * along 2^k paths, minutes for a 28-byte grammar. */
    int32_t *seen_keys;
    int64_t n_seen_keys, n_seen;
    size_t cap_seen_keys;
    seen_slot *seen;
    uint32_t gen;
    uint32_t seen_cap;
};

enum { G_STACKS = 1, G_WORK, G_DEPTH, G_MEMORY };

/* Records the first bound exceeded (sticky) with its message; returns T_OVER. */
static int32_t set_fail(grammar_state *st, int why) {
    if (st->fail) return T_OVER;
    st->fail = why;
    switch (why) {
    case G_STACKS:
        snprintf(st->fail_msg, sizeof st->fail_msg,
                 "grammar too ambiguous: more than %d parse stacks at one position "
                 "(at byte %lld of the output)",
                 (int)st->max_stacks, (long long)st->at_byte);
        break;
    case G_WORK:
        snprintf(st->fail_msg, sizeof st->fail_msg,
                 "grammar too ambiguous: matching one step took more than %lld units of work "
                 "(at byte %lld of the output)",
                 (long long)st->max_work, (long long)st->at_byte);
        break;
    case G_DEPTH:
        snprintf(st->fail_msg, sizeof st->fail_msg,
                 "grammar nests more than %d rules that can be entered without consuming input",
                 GRAMMAR_MAX_EXPAND_DEPTH);
        break;
    default:
        snprintf(st->fail_msg, sizeof st->fail_msg, "out of memory while matching the grammar");
    }
    return T_OVER;
}

/* Charges n units of work to this call; false (and the round fails) past the bound. */
static bool charge(grammar_state *st, int64_t n) {
    st->work += n;
    if (st->work <= st->max_work) return true;
    if (!st->overflow) st->overflow = G_WORK;
    return false;
}

static uint32_t hash_key(const int32_t *k, int32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)k[i];
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return (uint32_t)h;
}

static const int32_t *key_of(const grammar_state *st, int32_t id) {
    return st->keys + st->st[id].key_off;
}

static bool ht_grow(grammar_state *st) {
    uint32_t cap = st->ht_cap ? st->ht_cap * 2 : 1024;
    int32_t *ht = malloc((size_t)cap * sizeof *ht);
    if (!ht) return false;
    memset(ht, 0xFF, (size_t)cap * sizeof *ht);
    for (int32_t i = 0; i < st->n_st; i++) {
        uint32_t h = st->st[i].hash & (cap - 1);
        while (ht[h] >= 0) h = (h + 1) & (cap - 1);
        ht[h] = i;
    }
    free(st->ht);
    st->ht = ht;
    st->ht_cap = cap;
    return true;
}

/* The id of the state with this key, added if new; -1 on out of memory. */
static int32_t intern(grammar_state *st, const int32_t *key, int32_t len) {
    uint32_t h = hash_key(key, len);
    if ((uint32_t)(st->n_st + 1) * 2 > st->ht_cap && !ht_grow(st)) return -1;
    uint32_t slot = h & (st->ht_cap - 1);
    for (; st->ht[slot] >= 0; slot = (slot + 1) & (st->ht_cap - 1)) {
        const srec *r = &st->st[st->ht[slot]];
        if (r->hash == h && r->key_len == len &&
            memcmp(st->keys + r->key_off, key, (size_t)len * sizeof *key) == 0)
            return st->ht[slot];
    }
    if (st->n_st == st->cap_st) {
        int32_t c = st->cap_st ? st->cap_st * 2 : 64;
        srec *s = realloc(st->st, (size_t)c * sizeof *s);
        if (!s) return -1;
        st->st = s;
        int32_t *t = realloc(st->trans, (size_t)c * 256 * sizeof *t);
        if (!t) return -1;
        st->trans = t;
        st->cap_st = c;
    }
    for (int i = 0; i < 256; i++) st->trans[(size_t)st->n_st * 256 + i] = T_UNKNOWN;
    if (!kvl_grow((void **)&st->keys, &st->cap_keys, (size_t)(st->n_keys + len), sizeof *st->keys,
                  1024))
        return -1;
    memcpy(st->keys + st->n_keys, key, (size_t)len * sizeof *key);
    srec *r = &st->st[st->n_st];
    *r = (srec){.key_off = st->n_keys, .key_len = len, .hash = h};
    st->n_keys += len;
    /* can end: no partial code point and some stack is empty; must end: only that */
    if (key[K_PREM] == 0) {
        const int32_t *p = key + K_HDR;
        int32_t empty = 0;
        for (int32_t i = 0; i < key[K_NST]; i++) {
            empty += p[0] == 0;
            p += 1 + p[0];
        }
        r->can_end = empty > 0;
        r->must_end = empty == key[K_NST];
    }
    st->ht[slot] = st->n_st;
    return st->n_st++;
}

static bool out_reserve(grammar_state *st, int64_t n) {
    if (!charge(st, n)) return false; /* every word of every stack built counts */
    if (kvl_grow((void **)&st->out, &st->cap_out, (size_t)(st->n_out + n), sizeof *st->out, 1024))
        return true;
    st->overflow = G_MEMORY;
    return false;
}

static void emit_stack(grammar_state *st, const int32_t *stk, int32_t len, int32_t top) {
    int32_t n = len + (top >= 0);
    if (!out_reserve(st, 1 + n)) return;
    if (!kvl_grow((void **)&st->recs, &st->cap_recs, (size_t)st->n_recs + 1, sizeof *st->recs,
                  256)) {
        st->overflow = G_MEMORY;
        return;
    }
    st->recs[st->n_recs++] = st->n_out;
    st->out[st->n_out++] = n;
    if (len > 0)
        memcpy(st->out + st->n_out, stk,
               (size_t)len * sizeof *stk); /* stk may be NULL when empty */
    st->n_out += len;
    if (top >= 0) st->out[st->n_out++] = top;
}

/* Emits every stack that results from placing element pos on top of stk[0..len)
 * and expanding references until a code-point set (or nothing) is on top. */
static void expand_at(grammar_state *st, const int32_t *stk, int32_t len, int32_t pos);

static bool seen_grow(grammar_state *st) {
    uint32_t cap = st->seen_cap ? st->seen_cap * 2 : 1024;
    seen_slot *tab = calloc(cap, sizeof *tab);
    if (!tab) return false;
    for (uint32_t i = 0; i < st->seen_cap; i++) { /* this round's entries move over */
        if (st->seen[i].gen != st->gen || !st->seen[i].at) continue;
        const int32_t *k = st->seen_keys + st->seen[i].at - 1;
        uint32_t h = hash_key(k + 1, k[0] + 1) & (cap - 1);
        while (tab[h].at) h = (h + 1) & (cap - 1);
        tab[h] = st->seen[i];
    }
    free(st->seen);
    st->seen = tab;
    st->seen_cap = cap;
    return true;
}

/* Whether expand(stk, len, pos) already ran this round; records it if not.
 * Each call is charged its key's words; past the bound, or out of memory, the
 * round fails. */
static bool seen_before(grammar_state *st, const int32_t *stk, int32_t len, int32_t pos) {
    if (!charge(st, len + 2)) return true;
    if ((uint64_t)(st->n_seen + 1) * 2 > st->seen_cap && !seen_grow(st)) {
        st->overflow = G_MEMORY;
        return true;
    }
    if (!kvl_grow((void **)&st->seen_keys, &st->cap_seen_keys, (size_t)(st->n_seen_keys + len + 2),
                  sizeof *st->seen_keys, 1024)) {
        st->overflow = G_MEMORY;
        return true;
    }
    /* the candidate record, written where it would be kept */
    int32_t *rec = st->seen_keys + st->n_seen_keys;
    rec[0] = len;
    if (len > 0) memcpy(rec + 1, stk, (size_t)len * sizeof *stk);
    rec[len + 1] = pos;
    uint32_t slot = hash_key(rec + 1, len + 1) & (st->seen_cap - 1);
    for (; st->seen[slot].gen == st->gen && st->seen[slot].at;
         slot = (slot + 1) & (st->seen_cap - 1)) {
        const int32_t *k = st->seen_keys + st->seen[slot].at - 1;
        if (k[0] == len && memcmp(k + 1, rec + 1, (size_t)(len + 1) * sizeof *k) == 0) return true;
    }
    st->seen[slot] = (seen_slot){.at = st->n_seen_keys + 1, .gen = st->gen};
    st->n_seen_keys += len + 2;
    st->n_seen++;
    return false;
}

static void expand(grammar_state *st, const int32_t *stk, int32_t len, int32_t pos) {
    if (st->overflow || seen_before(st, stk, len, pos)) return;
    if (st->depth >= GRAMMAR_MAX_EXPAND_DEPTH) {
        st->overflow = G_DEPTH;
        return;
    }
    st->depth++;
    expand_at(st, stk, len, pos);
    st->depth--;
}

static void expand_at(grammar_state *st, const int32_t *stk, int32_t len, int32_t pos) {
    const grammar *g = st->g;
    const gelem *e = &g->elems[pos];
    if (e->kind == GE_CHARS) {
        emit_stack(st, stk, len, pos);
    } else if (e->kind == GE_END) {
        if (len == 0) emit_stack(st, stk, 0, -1);
        else expand(st, stk, len - 1, stk[len - 1]);
    } else {
        int32_t local[64], *buf = len + 1 <= 64 ? local : malloc((size_t)(len + 1) * sizeof *buf);
        if (!buf) {
            st->overflow = G_MEMORY;
            return;
        }
        if (len > 0) memcpy(buf, stk, (size_t)len * sizeof *buf);
        int32_t nl = len;
        if (g->elems[pos + 1].kind != GE_END) buf[nl++] = pos + 1;
        for (int32_t a = g->rule_alt[e->arg]; a < g->rule_alt[e->arg + 1]; a++)
            expand(st, buf, nl, g->alt_start[a]);
        if (buf != local) free(buf);
    }
}

static const int32_t *cmp_base;
static int cmp_rec(const void *a, const void *b) {
    const int32_t *x = cmp_base + *(const int64_t *)a, *y = cmp_base + *(const int64_t *)b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return memcmp(x + 1, y + 1, (size_t)x[0] * sizeof *x);
}

static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;

/* Interns the stacks in st->out (sorted, duplicates dropped) with the given
 * partial code point; T_DEAD when there are none, T_OVER when a bound was
 * exceeded on the way (the stacks are incomplete: refusing would be wrong). */
static int32_t intern_out(grammar_state *st, int32_t pval, int32_t prem) {
    if (st->overflow) return set_fail(st, st->overflow);
    if (st->n_recs == 0) return T_DEAD;
    pthread_mutex_lock(&sort_mu);
    cmp_base = st->out;
    qsort(st->recs, (size_t)st->n_recs, sizeof *st->recs, cmp_rec);
    pthread_mutex_unlock(&sort_mu);
    int64_t total = K_HDR;
    for (int64_t i = 0; i < st->n_recs; i++) total += 1 + st->out[st->recs[i]];
    int32_t *key = malloc((size_t)total * sizeof *key);
    if (!key) return set_fail(st, G_MEMORY);
    int32_t n = K_HDR, ns = 0;
    const int32_t *prev = NULL;
    for (int64_t i = 0; i < st->n_recs; i++) {
        const int32_t *r = st->out + st->recs[i];
        if (prev && prev[0] == r[0] && memcmp(prev + 1, r + 1, (size_t)r[0] * sizeof *r) == 0)
            continue;
        memcpy(key + n, r, (size_t)(1 + r[0]) * sizeof *r);
        n += 1 + r[0];
        ns++;
        prev = r;
    }
    key[K_PVAL] = pval;
    key[K_PREM] = prem;
    key[K_NST] = ns;
    if (ns > st->max_stacks) {
        free(key);
        return set_fail(st, G_STACKS);
    }
    int32_t id = intern(st, key, n);
    free(key);
    return id < 0 ? set_fail(st, G_MEMORY) : id;
}

static void scratch_reset(grammar_state *st) {
    st->n_out = 0;
    st->n_recs = 0;
    st->overflow = 0;
    st->n_seen_keys = 0; /* a new round: the old generation's slots read as empty */
    st->n_seen = 0;
    if (++st->gen == 0) { /* wrapped: clear the stamps once */
        if (st->seen) memset(st->seen, 0, st->seen_cap * sizeof *st->seen);
        st->gen = 1;
    }
}

/* Advances every stack of state id whose top accepts cp (all of them when
 * any_cp: a uniform partial state, whose stacks all take what comes). */
static int32_t advance(grammar_state *st, int32_t id, uint32_t cp, bool any_cp) {
    const grammar *g = st->g;
    scratch_reset(st);
    const int32_t *key = key_of(st, id);
    const int32_t *p = key + K_HDR;
    int32_t ns = key[K_NST];
    int32_t local[64];
    for (int32_t i = 0; i < ns; i++, p += 1 + p[0]) {
        int32_t len = p[0];
        if (len == 0) continue;
        int32_t top = p[len];
        if (!any_cp && !gset_has(g, g->elems[top].arg, cp)) continue;
        /* expand only appends to st->out, never to the key arena p points into */
        int32_t *tmp = len - 1 <= 64 ? local : malloc((size_t)(len - 1) * sizeof *tmp);
        if (!tmp) return set_fail(st, G_MEMORY);
        memcpy(tmp, p + 1, (size_t)(len - 1) * sizeof *tmp);
        expand(st, tmp, len - 1, top + 1);
        if (tmp != local) free(tmp);
    }
    return intern_out(st, 0, 0);
}

/* A uniform partial state from state id: its stacks whose tops take [lo, hi]. */
static int32_t uniform_from(grammar_state *st, int32_t id, int32_t prem, int32_t plen, uint32_t lo,
                            uint32_t hi) {
    const grammar *g = st->g;
    const int32_t *key = key_of(st, id);
    int32_t len = st->st[id].key_len;
    int32_t *k = malloc((size_t)len * sizeof *k);
    if (!k) return set_fail(st, G_MEMORY);
    const int32_t *p = key + K_HDR;
    int32_t n = K_HDR, ns = 0;
    for (int32_t i = 0; i < key[K_NST]; i++, p += 1 + p[0])
        if (p[0] > 0 && gset_meets(g, g->elems[p[p[0]]].arg, lo, hi)) {
            memcpy(k + n, p, (size_t)(1 + p[0]) * sizeof *p);
            n += 1 + p[0];
            ns++;
        }
    k[K_PVAL] = 0;
    k[K_PREM] = prem | plen << 4 | P_UNIFORM;
    k[K_NST] = ns;
    int32_t nid = intern(st, k, n);
    free(k);
    return nid < 0 ? set_fail(st, G_MEMORY) : nid;
}

/* The uniform partial state with one byte fewer to go. */
static int32_t uniform_partial(grammar_state *st, int32_t id, int32_t prem, int32_t plen) {
    int32_t len = st->st[id].key_len;
    int32_t *k = malloc((size_t)len * sizeof *k);
    if (!k) return set_fail(st, G_MEMORY);
    memcpy(k, key_of(st, id), (size_t)len * sizeof *k);
    k[K_PREM] = prem | plen << 4 | P_UNIFORM;
    int32_t nid = intern(st, k, len);
    free(k);
    return nid < 0 ? set_fail(st, G_MEMORY) : nid;
}

/* The state after reading byte b in state id (computed, not cached). */
static int32_t step_byte(grammar_state *st, int32_t id, uint8_t b) {
    const grammar *g = st->g;
    const int32_t *key = key_of(st, id);
    int32_t pval = key[K_PVAL], prem = key[K_PREM] & 15, plen = (key[K_PREM] >> 4) & 15;
    const bool uniform = key[K_PREM] & P_UNIFORM;
    uint32_t cp = 0;
    if (uniform) {
        /* every stack here takes any code point these bytes can still make */
        if ((b & 0xC0) != 0x80) return T_DEAD;
        if (--prem > 0) return uniform_partial(st, id, prem, plen);
        return advance(st, id, 0, true);
    }
    if (prem == 0) {
        if (b < 0x80) {
            cp = b;
        } else {
            int n = b >= 0xC2 && b <= 0xDF   ? 2
                    : b >= 0xE0 && b <= 0xEF ? 3
                    : b >= 0xF0 && b <= 0xF4 ? 4
                                             : 0;
            if (!n) return T_DEAD;
            pval = b & (0x7F >> n);
            prem = n - 1;
            plen = n;
            goto partial;
        }
    } else {
        if ((b & 0xC0) != 0x80) return T_DEAD;
        pval = pval << 6 | (b & 0x3F);
        if (--prem > 0) goto partial;
        cp = (uint32_t)pval;
        if ((plen == 3 && cp < 0x800) || (plen == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return T_DEAD;
    }
    return advance(st, id, cp, false);
partial : {
    /* inside a code point: keep the stacks if some top accepts a code point
     * that starts with these bits */
    uint32_t lo = (uint32_t)pval << (6 * prem), hi = lo | ((1u << (6 * prem)) - 1);
    /* only code points this length may encode: no overlongs (E0 80, F0 80),
     * nothing past U+10FFFF (F4 90), no surrogates (ED A0) */
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (lo < min_cp[plen]) lo = min_cp[plen];
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo >= 0xD800 && hi <= 0xDFFF) return T_DEAD;
    if (lo > hi) return T_DEAD;
    const int32_t *p = key + K_HDR;
    bool any = false;
    for (int32_t i = 0; i < key[K_NST] && !any; i++, p += 1 + p[0])
        any = p[0] > 0 && gset_meets(g, g->elems[p[p[0]]].arg, lo, hi);
    if (!any) return T_DEAD;
    /* When each stack takes either all or none of the code points still
     * possible, the exact bits no longer matter: keep the stacks that take
     * them, and forget the bits. Inside a string, where a class takes every
     * non-ASCII code point, this makes one state per remaining byte count
     * instead of one per prefix. Not for leads whose next byte may still make
     * an overlong form, a surrogate or a value past U+10FFFF. */
    const int consumed = plen - prem;
    const int lead = consumed == 1 ? (int)b : -1;
    if (plen == 2 || consumed >= 2 ||
        !(lead == 0xE0 || lead == 0xED || lead == 0xF0 || lead == 0xF4)) {
        bool uni = true;
        p = key + K_HDR;
        for (int32_t i = 0; i < key[K_NST] && uni; i++, p += 1 + p[0])
            if (p[0] > 0) {
                int32_t set = g->elems[p[p[0]]].arg;
                uni = gset_meets(g, set, lo, hi) == gset_covers(g, set, lo, hi);
            }
        if (uni) return uniform_from(st, id, prem, plen, lo, hi);
    }
    int32_t len = st->st[id].key_len;
    int32_t *k = malloc((size_t)len * sizeof *k);
    if (!k) return set_fail(st, G_MEMORY);
    memcpy(k, key, (size_t)len * sizeof *k);
    k[K_PVAL] = pval;
    k[K_PREM] = prem | plen << 4;
    int32_t nid = intern(st, k, len);
    free(k);
    return nid < 0 ? set_fail(st, G_MEMORY) : nid;
}
}

static inline int32_t next_state(grammar_state *st, int32_t id, uint8_t b) {
    int32_t t = st->trans[(size_t)id * 256 + b];
    if (t != T_UNKNOWN) return t;
    t = step_byte(st, id, b);
    st->trans[(size_t)id * 256 + b] = t;
    return t;
}

static void cache_clear(grammar_state *st) {
    for (int i = 0; i < MASK_MEMO; i++) st->memo[i].state = -1; /* the ids are reused */
    st->n_st = 0;
    st->n_keys = 0;
    if (st->ht) memset(st->ht, 0xFF, (size_t)st->ht_cap * sizeof *st->ht);
}

/* Keeps the cache bounded: past the limits, forget every state but the current one. */
static void maybe_restart(grammar_state *st) {
    if (st->n_st <= STATE_SOFT_LIMIT && st->n_keys <= STATE_SOFT_WORDS) return;
    int32_t len = st->st[st->cur].key_len;
    int32_t *k = malloc((size_t)len * sizeof *k);
    if (!k) {
        set_fail(st, G_MEMORY);
        return;
    }
    memcpy(k, key_of(st, st->cur), (size_t)len * sizeof *k);
    cache_clear(st);
    int32_t cur = intern(st, k, len); /* cannot fail: the arrays only shrank */
    free(k);
    if (cur < 0) set_fail(st, G_MEMORY);
    else st->cur = cur;
}

/* Each public call starts a step: a fresh work budget; false once failed. */
static bool step_begin(grammar_state *st) {
    if (st->fail) return false;
    st->work = 0;
    maybe_restart(st);
    return !st->fail;
}

grammar_state *grammar_state_new(const grammar *g) {
    grammar_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->g = g;
    st->max_stacks = GRAMMAR_MAX_STACKS;
    st->max_work = GRAMMAR_MAX_STEP_WORK;
    for (int i = 0; i < MASK_MEMO; i++) st->memo[i].state = -1;
    /* the start: root's alternatives expanded on an empty stack */
    scratch_reset(st);
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        expand(st, NULL, 0, g->alt_start[a]);
    st->cur = intern_out(st, 0, 0);
    if (st->cur < 0) {
        /* over a bound (st->fail says which; every call answers false), or a
         * grammar with no sentence at all (e.g. root ::= [^\x00-\U0010FFFF]):
         * either way a state with no stacks, so nothing is ever allowed */
        int32_t key[K_HDR] = {0, 0, 0};
        st->cur = intern(st, key, K_HDR);
    }
    if (g->vocab) st->walk = malloc((size_t)(g->vocab->max_depth + 1) * sizeof *st->walk);
    if (st->cur < 0 || (g->vocab && !st->walk)) {
        grammar_state_free(st);
        return NULL;
    }
    return st;
}

void grammar_state_free(grammar_state *st) {
    if (!st) return;
    free(st->trans);
    free(st->st);
    free(st->keys);
    free(st->ht);
    free(st->out);
    free(st->recs);
    free(st->walk);
    free(st->seen_keys);
    free(st->seen);
    for (int i = 0; i < MASK_MEMO; i++) free(st->memo[i].bits);
    free(st);
}

void grammar_state_set_limits(grammar_state *st, int32_t max_stacks, int64_t max_work) {
    st->max_stacks = max_stacks;
    st->max_work = max_work;
}

const char *grammar_state_error(const grammar_state *st) { return st->fail ? st->fail_msg : NULL; }

/* The state after p[0..n) from the current one: T_DEAD, or T_OVER (failed). */
static int32_t walk_bytes(grammar_state *st, const char *p, size_t n) {
    if (!step_begin(st)) return T_OVER;
    int32_t s = st->cur;
    for (size_t i = 0; i < n && s >= 0; i++) {
        st->at_byte = st->n_bytes + (int64_t)i + 1;
        s = next_state(st, s, (uint8_t)p[i]);
    }
    return s;
}

bool grammar_state_accept_bytes(grammar_state *st, const char *p, size_t n) {
    int32_t s = walk_bytes(st, p, n);
    if (s < 0) return false;
    st->cur = s;
    st->n_bytes += (int64_t)n;
    return true;
}

bool grammar_state_allows_bytes(grammar_state *st, const char *p, size_t n) {
    return walk_bytes(st, p, n) >= 0;
}

bool grammar_state_can_end(const grammar_state *st) { return !st->fail && st->st[st->cur].can_end; }
bool grammar_state_must_end(const grammar_state *st) {
    return !st->fail && st->st[st->cur].must_end;
}

static bool is_eog(const gvocab *gv, int32_t tok) {
    for (int32_t i = 0; i < gv->n_eog; i++)
        if (gv->eog[i] == tok) return true;
    return false;
}

bool grammar_state_accept_token(grammar_state *st, int32_t token) {
    const gvocab *gv = st->g->vocab;
    if (!gv || token < 0 || token >= gv->n_vocab) return false;
    if (is_eog(gv, token)) return grammar_state_can_end(st);
    if (!gv->text[token]) return false;
    return grammar_state_accept_bytes(st, gv->text[token], gv->text_len[token]);
}

static int32_t mask_walk(grammar_state *st, uint32_t *allowed, int32_t n_vocab);

int32_t grammar_state_mask(grammar_state *st, uint32_t *allowed, int32_t n_vocab) {
    const size_t words = (size_t)(n_vocab + 31) / 32;
    memset(allowed, 0, words * sizeof *allowed);
    if (!step_begin(st)) return -1;
    if (!st->g->vocab) return 0;
    for (int i = 0; i < MASK_MEMO; i++)
        if (st->memo[i].state == st->cur && st->memo[i].n_vocab == n_vocab) {
            memcpy(allowed, st->memo[i].bits, words * sizeof *allowed);
            return st->memo[i].count;
        }
    int32_t count = mask_walk(st, allowed, n_vocab);
    if (count < 0) {
        memset(allowed, 0, words * sizeof *allowed);
        return -1;
    }
    int k = st->memo_next;
    uint32_t *bits = st->memo[k].n_vocab == n_vocab
                         ? st->memo[k].bits
                         : realloc(st->memo[k].bits, words * sizeof *bits);
    if (bits) {
        memcpy(bits, allowed, words * sizeof *bits);
        st->memo[k].bits = bits;
        st->memo[k].state = st->cur;
        st->memo[k].n_vocab = n_vocab;
        st->memo[k].count = count;
        st->memo_next = (k + 1) % MASK_MEMO;
    }
    return count;
}

static int32_t mask_walk(grammar_state *st, uint32_t *allowed, int32_t n_vocab) {
    memset(allowed, 0, (size_t)(n_vocab + 31) / 32 * sizeof *allowed);
    const gvocab *gv = st->g->vocab;
    int32_t count = 0;
    const int32_t N = gv->n_nodes, limit = n_vocab < gv->n_vocab ? n_vocab : gv->n_vocab;
    int32_t *walk = st->walk;
    walk[0] = st->cur;
    const gnode *node = gv->node;
    for (int32_t i = 1; i < N;) {
        const gnode nd = node[i];
        st->at_byte = st->n_bytes + nd.depth;
        int32_t s = next_state(st, walk[nd.depth - 1], nd.byte);
        if (s == T_OVER) return -1;
        if (s < 0) {
            i = (int32_t)nd.end;
            continue;
        }
        walk[nd.depth] = s;
        if (nd.has_tok)
            for (int32_t k = gv->tok_off[i]; k < gv->tok_off[i + 1]; k++) {
                int32_t t = gv->toks[k];
                if (t < limit) {
                    allowed[t >> 5] |= 1u << (t & 31);
                    count++;
                }
            }
        i++;
    }
    if (grammar_state_can_end(st))
        for (int32_t i = 0; i < gv->n_eog; i++)
            if (gv->eog[i] < limit) {
                allowed[gv->eog[i] >> 5] |= 1u << (gv->eog[i] & 31);
                count++;
            }
    return count;
}

int grammar_match(const grammar *g, const char *text, size_t n, kvl_error *err) {
    grammar_state *st = grammar_state_new(g);
    if (!st) return kvl_fail(err, "out of memory while matching the grammar"), -1;
    int r = grammar_state_accept_bytes(st, text, n) && grammar_state_can_end(st);
    if (st->fail) r = -1, kvl_fail(err, "%s", st->fail_msg);
    grammar_state_free(st);
    return r;
}

bool grammar_match_text(const grammar *g, const char *text, size_t n) {
    kvl_error err = {{0}};
    return grammar_match(g, text, n, &err) == 1;
}

bool grammar_check_start(const grammar *g, kvl_error *err) {
    grammar_state *st = grammar_state_new(g);
    if (!st) return kvl_fail(err, "out of memory while compiling the grammar");
    bool ok = !st->fail;
    if (!ok) kvl_fail(err, "%s", st->fail_msg);
    grammar_state_free(st);
    return ok;
}
