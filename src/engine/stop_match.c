/* stop_match: see stop_match.h. */
#include "stop_match.h"

#include <stdlib.h>
#include <string.h>

bool stop_matcher_init(stop_matcher *m, const char *const *pats, int n) {
    memset(m, 0, sizeof *m);
    m->first = -1;
    if (n <= 0) return true;
    m->pat = calloc((size_t)n, sizeof *m->pat);
    m->len = calloc((size_t)n, sizeof *m->len);
    m->fail = calloc((size_t)n, sizeof *m->fail);
    m->state = calloc((size_t)n, sizeof *m->state);
    if (!m->pat || !m->len || !m->fail || !m->state) {
        stop_matcher_free(m);
        return false;
    }
    for (int i = 0; i < n; i++) {
        size_t l = strlen(pats[i]);
        if (l == 0) continue;
        uint32_t *f = malloc(l * sizeof *f);
        if (!f) {
            stop_matcher_free(m);
            return false;
        }
        const char *p = pats[i];
        f[0] = 0;
        for (size_t j = 1, k = 0; j < l; j++) {
            while (k > 0 && p[j] != p[k]) k = f[k - 1];
            if (p[j] == p[k]) k++;
            f[j] = (uint32_t)k;
        }
        m->pat[m->n] = p;
        m->len[m->n] = l;
        m->fail[m->n] = f;
        m->n++;
    }
    return true;
}

void stop_matcher_free(stop_matcher *m) {
    for (int i = 0; m->fail && i < m->n; i++) free(m->fail[i]);
    free(m->fail);
    free(m->pat);
    free(m->len);
    free(m->state);
    memset(m, 0, sizeof *m);
    m->first = -1;
}

int64_t stop_matcher_feed(stop_matcher *m, const char *p, size_t n) {
    for (size_t b = 0; b < n; b++) {
        const char c = p[b];
        m->fed++;
        for (int i = 0; i < m->n; i++) {
            const char *pat = m->pat[i];
            size_t k = m->state[i];
            if (k == m->len[i]) k = m->fail[i][k - 1]; /* after a full match, keep going */
            while (k > 0 && pat[k] != c) k = m->fail[i][k - 1];
            if (pat[k] == c) k++;
            m->state[i] = k;
            if (k == m->len[i]) {
                int64_t start = (int64_t)(m->fed - k);
                if (m->first < 0 || start < m->first) m->first = start, m->first_pat = pat;
            }
        }
    }
    return m->first;
}

size_t stop_matcher_pending(const stop_matcher *m) {
    size_t hold = 0;
    for (int i = 0; i < m->n; i++) {
        size_t k = m->state[i] == m->len[i] ? m->fail[i][m->len[i] - 1] : m->state[i];
        if (k > hold) hold = k;
    }
    return hold;
}

void stop_matcher_forget(stop_matcher *m) {
    m->first = -1;
    m->first_pat = NULL;
}
