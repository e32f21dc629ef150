/* Sampler internals for speculative sampling (src/spec): the distribution
 * ellm_sampler_sample draws from, and its random stream. */
#ifndef ELLM_ENGINE_SAMPLER_H
#define ELLM_ENGINE_SAMPLER_H

#include "ellm.h"

/* Non-zero when the sampler is greedy (temperature <= 0). */
int engine_sampler_greedy(const ellm_sampler *s);
/* Writes to probs (n_vocab floats) the distribution ellm_sampler_sample would
 * draw from given the same logits and history (greedy: one-hot on its pick). */
void engine_sampler_probs(ellm_sampler *s, const float *logits, const int32_t *hist, int n_hist, float *probs);
/* The next uniform number in [0, 1) of the sampler's seeded stream. */
double engine_sampler_uniform(ellm_sampler *s);

#endif
