/* Log-probabilities of generated tokens, for the OpenAI API's `logprobs`.
 *
 * They are the model's own distribution at that position: the log-softmax of
 * the logits, before temperature, top-k, top-p or min-p shape what is
 * sampled (as OpenAI reports them and llama-server does by default). Each
 * token gets the chosen token's log-probability and, if asked, the most
 * likely tokens of the distribution, highest first. */
#ifndef ELLM_SERVER_LOGPROBS_H
#define ELLM_SERVER_LOGPROBS_H

#include "server/request.h"

#include <stdint.h>

typedef struct {
    int32_t id;
    float logprob;
} logprobs_item;

typedef struct {
    logprobs_item chosen;                    /* logprob NAN: none (an echoed prompt's first token) */
    int n_top;                               /* alternatives in top[] */
    logprobs_item top[REQ_MAX_TOP_LOGPROBS]; /* highest first; equal ones by lower id */
} logprobs_token;

/* *out for the token `chosen` from n_vocab logits, with the `top` (at most
 * REQ_MAX_TOP_LOGPROBS and n_vocab) most likely tokens. */
void logprobs_compute(const float *logits, int n_vocab, int32_t chosen, int top, logprobs_token *out);

#endif
