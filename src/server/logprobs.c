/* Log-softmax of one row of logits and its most likely tokens. */
#include "server/logprobs.h"
#include "kernels/kernels.h"

#include <math.h>

/* Largest of x[0 .. 64), NaNs never winning (8 independent lanes: the
 * compiler keeps them in vector registers). */
static float block_max(const float *x) {
    float m[8];
    for (int k = 0; k < 8; k++) m[k] = x[k];
    for (int j = 8; j < 64; j += 8)
        for (int k = 0; k < 8; k++) m[k] = x[j + k] > m[k] ? x[j + k] : m[k];
    float mm = m[0];
    for (int k = 1; k < 8; k++) mm = m[k] > mm ? m[k] : mm;
    return mm;
}

/* Keeps top[0 .. *n) (at most k, sorted by logit, equal ones by lower id)
 * with token i if it belongs there. */
static void top_insert(const float *logits, int32_t i, int k, logprobs_item *top, int *n) {
    const float l = logits[i];
    if (*n == k && !(l > logits[top[*n - 1].id])) return;
    int j = *n < k ? (*n)++ : *n - 1;
    while (j > 0 && l > logits[top[j - 1].id]) {
        top[j] = top[j - 1];
        j--;
    }
    top[j].id = i;
}

void logprobs_compute(const float *logits, int n_vocab, int32_t chosen, int top, logprobs_token *out) {
    if (top > REQ_MAX_TOP_LOGPROBS) top = REQ_MAX_TOP_LOGPROBS;
    if (top > n_vocab) top = n_vocab;
    if (top < 0) top = 0;
    const double lse = kern_logsumexp(logits, n_vocab);
    /* the top tokens by logit, in id order: a block of 64 whose largest does
     * not beat the last kept token (once top are kept) is skipped whole */
    int n = 0, i = 0;
    for (; top > 0 && i + 64 <= n_vocab; i += 64) {
        if (n == top && !(block_max(logits + i) > logits[out->top[n - 1].id])) continue;
        for (int j = 0; j < 64; j++) top_insert(logits, i + j, top, out->top, &n);
    }
    for (; top > 0 && i < n_vocab; i++) top_insert(logits, i, top, out->top, &n);
    for (int k = 0; k < n; k++) out->top[k].logprob = (float)((double)logits[out->top[k].id] - lse);
    out->n_top = n;
    out->chosen.id = chosen;
    out->chosen.logprob = chosen >= 0 && chosen < n_vocab ? (float)((double)logits[chosen] - lse) : -INFINITY;
}
