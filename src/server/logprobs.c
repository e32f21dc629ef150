/* Log-softmax of one row of logits and its most likely tokens. */
#include "server/logprobs.h"

#include <math.h>

void logprobs_compute(const float *logits, int n_vocab, int32_t chosen, int top, token_logprobs *out) {
    if (top > REQ_MAX_TOP_LOGPROBS) top = REQ_MAX_TOP_LOGPROBS;
    if (top > n_vocab) top = n_vocab;
    if (top < 0) top = 0;
    float mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    const double lse = (double)mx + log(sum);
    /* the top tokens by logit, kept sorted: a token enters only when it
     * beats the last kept one, so equal logits keep the lower id first */
    int n = 0;
    for (int i = 0; i < n_vocab && top > 0; i++) {
        const float l = logits[i];
        if (n == top && !(l > logits[out->top[n - 1].id])) continue;
        int k = n < top ? n++ : n - 1;
        while (k > 0 && l > logits[out->top[k - 1].id]) {
            out->top[k] = out->top[k - 1];
            k--;
        }
        out->top[k].id = i;
    }
    for (int k = 0; k < n; k++) out->top[k].logprob = (float)((double)logits[out->top[k].id] - lse);
    out->n_top = n;
    out->chosen.id = chosen;
    out->chosen.logprob = chosen >= 0 && chosen < n_vocab ? (float)((double)logits[chosen] - lse) : -INFINITY;
}
