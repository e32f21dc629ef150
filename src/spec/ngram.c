/* N-gram (prompt / suffix lookup) drafter: code, edits and summaries repeat
 * spans of their context, so the tokens that followed an earlier occurrence
 * of the current suffix are a free guess at what comes next. */
#include "spec/spec.h"

int spec_ngram_propose(const int32_t *hist, int n, int max, int32_t *out) {
    if (n < 2 || max <= 0) return 0;
    for (int len = n - 1 < SPEC_NGRAM_MAX ? n - 1 : SPEC_NGRAM_MAX; len >= 1; len--) {
        const int32_t *suffix = hist + n - len;
        /* the most recent earlier occurrence: start i, ending before the suffix itself */
        for (int i = n - len - 1; i >= 0; i--) {
            int j = 0;
            while (j < len && hist[i + j] == suffix[j]) j++;
            if (j < len) continue;
            int k = 0;
            for (int p = i + len; p < n && k < max; p++) out[k++] = hist[p];
            if (k > 0) return k;
        }
    }
    return 0;
}
