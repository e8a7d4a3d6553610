/* stop_match against the definition it replaces: after each piece fed, the
 * earliest-starting occurrence of any stop string in all the text so far
 * (strstr over the whole text), and the longest tail that is a proper prefix
 * of some string (memcmp at every length). Random texts and strings over a
 * two- and three-letter alphabet (so borders and overlaps are common), fed in
 * random piece sizes; then a long string split across many small pieces. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "stop_match.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static int64_t ref_first(const char *text, char **pats, int n) {
    int64_t best = -1;
    for (int i = 0; i < n; i++) {
        if (!pats[i][0]) continue;
        const char *hit = strstr(text, pats[i]);
        if (hit && (best < 0 || hit - text < best)) best = hit - text;
    }
    return best;
}

static size_t ref_pending(const char *text, size_t len, char **pats, int n) {
    size_t hold = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(pats[i]);
        for (size_t k = l > 1 ? l - 1 : 0; k > hold; k--)
            if (k <= len && memcmp(text + len - k, pats[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

static void random_cases(void) {
    for (int trial = 0; trial < 3000; trial++) {
        const int alpha = 2 + (int)(next_u32() % 2);
        int n = (int)(next_u32() % 5);
        char *pats[5];
        for (int i = 0; i < n; i++) {
            size_t l = next_u32() % 7; /* 0: the empty string, ignored */
            pats[i] = malloc(l + 1);
            for (size_t k = 0; k < l; k++) pats[i][k] = (char)('a' + next_u32() % alpha);
            pats[i][l] = 0;
        }
        stop_matcher m;
        CHECK(stop_matcher_init(&m, (const char *const *)pats, n));
        char text[129];
        size_t len = 0;
        const size_t total = next_u32() % 128;
        while (len < total) {
            size_t piece = 1 + next_u32() % 5;
            if (len + piece > total) piece = total - len;
            for (size_t k = 0; k < piece; k++) text[len + k] = (char)('a' + next_u32() % alpha);
            text[len + piece] = 0;
            int64_t got = stop_matcher_feed(&m, text + len, piece);
            len += piece;
            int64_t want = ref_first(text, pats, n);
            CHECK(got == want, "trial %d: first match at %lld, strstr says %lld (text '%s')", trial,
                  (long long)got, (long long)want, text);
            if (want >= 0) { /* the engine stops here; first_pat is what it reports */
                bool ours = false;
                for (int i = 0; i < n; i++) ours |= m.first_pat == pats[i];
                CHECK(ours && strncmp(text + want, m.first_pat, strlen(m.first_pat)) == 0,
                      "trial %d: first_pat '%s' is not the string found at %lld", trial,
                      m.first_pat ? m.first_pat : "(null)", (long long)want);
                break;
            }
            size_t hold = stop_matcher_pending(&m), want_hold = ref_pending(text, len, pats, n);
            CHECK(hold == want_hold, "trial %d: pending %zu, expected %zu (text '%s')", trial, hold,
                  want_hold, text);
        }
        stop_matcher_free(&m);
        for (int i = 0; i < n; i++) free(pats[i]);
    }
}

/* A 4096-byte string with a long border, fed one to three bytes at a time
 * after a near miss: found at the right offset, pending tracks it. */
static void long_string(void) {
    char *pat = malloc(ENGINE_MAX_STOP_BYTES + 1);
    for (int i = 0; i < ENGINE_MAX_STOP_BYTES; i++) pat[i] = (char)(i % 1000 == 999 ? 'b' : 'a');
    pat[ENGINE_MAX_STOP_BYTES] = 0;
    const char *pats[] = {pat, "zz"};
    stop_matcher m;
    CHECK(stop_matcher_init(&m, pats, 2));
    size_t fed = 0;
    /* a near miss: all but the last byte, then a 'z' */
    for (size_t i = 0; i + 1 < ENGINE_MAX_STOP_BYTES; i++, fed++) stop_matcher_feed(&m, pat + i, 1);
    CHECK(stop_matcher_pending(&m) == ENGINE_MAX_STOP_BYTES - 1);
    CHECK(stop_matcher_feed(&m, "z", 1) == -1 && stop_matcher_pending(&m) == 1);
    fed++;
    for (size_t i = 0; i < ENGINE_MAX_STOP_BYTES;) {
        size_t piece = 1 + i % 3;
        if (i + piece > ENGINE_MAX_STOP_BYTES) piece = ENGINE_MAX_STOP_BYTES - i;
        int64_t got = stop_matcher_feed(&m, pat + i, piece);
        i += piece;
        CHECK(got == (i == ENGINE_MAX_STOP_BYTES ? (int64_t)fed : -1), "after %zu bytes: %lld", i,
              (long long)got);
    }
    stop_matcher_free(&m);
    free(pat);
}

int main(void) {
    random_cases();
    long_string();
    return failures != 0;
}
