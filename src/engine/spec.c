/* spec: see spec.h. */
#include "spec.h"

#include <string.h>

int spec_ngram_propose(const int32_t *toks, int64_t n, int ngram_max, int k, int32_t *out) {
    if (k <= 0 || n < 2) return 0;
    for (int g = ngram_max; g >= 1; g--) {
        if (g >= n) continue;
        const int32_t *pat = toks + n - g;
        /* the most recent earlier occurrence, ending before the last token so
         * that something follows it */
        for (int64_t i = n - g - 1; i >= 0; i--) {
            if (toks[i] != pat[0] || memcmp(toks + i, pat, (size_t)g * sizeof *pat) != 0) continue;
            int64_t from = i + g, m = n - from < k ? n - from : k;
            memcpy(out, toks + from, (size_t)m * sizeof *out);
            return (int)m;
        }
    }
    return 0;
}

enum { COOLDOWN_STEPS = 16 };

void spec_adapt_init(spec_adapt *a, int k_max) {
    a->k = k_max;
    a->cooldown = 0;
}

int spec_adapt_want(spec_adapt *a) {
    if (a->k > 0) return a->k;
    if (a->cooldown > 0 && --a->cooldown > 0) return 0;
    a->k = 1; /* try again, cautiously */
    return a->k;
}

void spec_adapt_update(spec_adapt *a, int k_max, int drafted, int accepted) {
    if (drafted <= 0) return;
    if (accepted == drafted) {
        if (a->k < k_max) a->k++;
    } else if (accepted == 0) {
        a->k /= 2;
        if (a->k == 0) a->cooldown = COOLDOWN_STEPS;
    } else {
        a->k = accepted + 1 < k_max ? accepted + 1 : k_max;
    }
}
