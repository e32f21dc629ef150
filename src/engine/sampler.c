/* Token sampling: logit bias, repetition / presence / frequency penalties,
 * top-k, top-p, min-p, temperature, then a draw from a seeded xoshiro256**
 * generator (same seed, same output). Greedy when temperature <= 0. */
#include "core/status.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t id;
    float logit;
} candidate;

struct ellm_sampler {
    ellm_sampler_params p;
    int n_vocab;
    candidate *cand; /* n_vocab */
    float *prob;     /* n_vocab */
    int32_t *count;  /* n_vocab: occurrences in the penalty window (zero between calls) */
    int32_t *bias_id;
    float *bias;
    int n_bias;
    uint64_t rng[4];
};

ellm_sampler_params ellm_sampler_default_params(void) {
    ellm_sampler_params p = {.temperature = 0.8f,
                             .top_k = 40,
                             .top_p = 0.95f,
                             .min_p = 0.05f,
                             .repeat_penalty = 1.0f,
                             .repeat_last_n = 64,
                             .seed = 0x5eed};
    return p;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform double in [0, 1). */
static double rng_uniform(uint64_t *s) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

ellm_status ellm_sampler_init(const ellm_sampler_params *params, int n_vocab, ellm_sampler **out,
                              ellm_error *err) {
    *out = NULL;
    if (n_vocab <= 0) return ellm_fail(err, ELLM_ERR_ARG, "sampler: vocabulary size %d", n_vocab);
    ellm_sampler_params p = params ? *params : ellm_sampler_default_params();
    if (!(p.top_p > 0)) return ellm_fail(err, ELLM_ERR_ARG, "sampler: top-p must be > 0 (got %g)", p.top_p);
    if (p.min_p >= 1) return ellm_fail(err, ELLM_ERR_ARG, "sampler: min-p must be < 1 (got %g)", p.min_p);
    if (!(p.repeat_penalty > 0))
        return ellm_fail(err, ELLM_ERR_ARG, "sampler: repeat penalty must be > 0 (got %g)", p.repeat_penalty);
    if (!isfinite(p.presence_penalty) || !isfinite(p.frequency_penalty))
        return ellm_fail(err, ELLM_ERR_ARG, "sampler: presence and frequency penalties must be finite");
    ellm_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
        s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
        s->count = calloc((size_t)n_vocab, sizeof *s->count);
    }
    if (!s || !s->cand || !s->prob || !s->count) {
        ellm_sampler_free(s);
        return ellm_fail(err, ELLM_ERR_NOMEM, "sampler: out of memory");
    }
    s->p = p;
    s->n_vocab = n_vocab;
    uint64_t x = p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return ELLM_OK;
}

void ellm_sampler_free(ellm_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->prob);
    free(s->count);
    free(s->bias_id);
    free(s->bias);
    free(s);
}

ellm_status ellm_sampler_set_logit_bias(ellm_sampler *s, const int32_t *ids, const float *bias, int n, ellm_error *err) {
    if (n < 0) return ellm_fail(err, ELLM_ERR_ARG, "sampler: %d logit biases", n);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->n_vocab)
            return ellm_fail(err, ELLM_ERR_ARG, "sampler: logit bias for token %d, outside the vocabulary of %d",
                             (int)ids[i], s->n_vocab);
        if (isnan(bias[i])) return ellm_fail(err, ELLM_ERR_ARG, "sampler: logit bias for token %d is NaN", (int)ids[i]);
    }
    int32_t *id = n ? malloc((size_t)n * sizeof *id) : NULL;
    float *b = n ? malloc((size_t)n * sizeof *b) : NULL;
    if (n && (!id || !b)) {
        free(id);
        free(b);
        return ellm_fail(err, ELLM_ERR_NOMEM, "sampler: out of memory");
    }
    if (n) {
        memcpy(id, ids, (size_t)n * sizeof *id);
        memcpy(b, bias, (size_t)n * sizeof *b);
    }
    free(s->bias_id);
    free(s->bias);
    s->bias_id = id;
    s->bias = b;
    s->n_bias = n;
    return ELLM_OK;
}

/* 1 if some penalty applies to this history. */
static int sampler_penalizes(const ellm_sampler *s, const int32_t *hist, int n_hist) {
    const ellm_sampler_params *p = &s->p;
    return (p->repeat_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0) && hist && n_hist > 0;
}

/* 1 if the logits go through sampler_penalize (a bias or a penalty with a history). */
static int sampler_adjusts(const ellm_sampler *s, const int32_t *hist, int n_hist) {
    return s->n_bias > 0 || sampler_penalizes(s, hist, n_hist);
}

static int cmp_desc(const void *a, const void *b) {
    float x = ((const candidate *)a)->logit, y = ((const candidate *)b)->logit;
    if (x > y) return -1;
    if (x < y) return 1;
    return ((const candidate *)a)->id - ((const candidate *)b)->id;
}

/* Restores the min-heap c[0..k) (smallest by cmp_desc order at the root)
 * below position j. */
static void heap_sift_down(candidate *c, int k, int j) {
    for (;;) {
        int l = 2 * j + 1, r = l + 1, m = j;
        if (l < k && cmp_desc(&c[l], &c[m]) > 0) m = l;
        if (r < k && cmp_desc(&c[r], &c[m]) > 0) m = r;
        if (m == j) return;
        candidate t = c[j];
        c[j] = c[m];
        c[m] = t;
        j = m;
    }
}

/* Moves the k largest candidates to the front, sorted descending: a min-heap of
 * size k over the array (O(n log k)), then a sort of the k. */
static void partial_top_k(candidate *c, int n, int k) {
    if (k >= n) {
        qsort(c, (size_t)n, sizeof *c, cmp_desc);
        return;
    }
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(c, k, i);
    for (int i = k; i < n; i++) {
        if (cmp_desc(&c[i], &c[0]) >= 0) continue; /* not better than the smallest kept */
        candidate t = c[0];
        c[0] = c[i];
        c[i] = t;
        heap_sift_down(c, k, 0);
    }
    qsort(c, (size_t)k, sizeof *c, cmp_desc);
}

/* The candidates (all n_vocab, in id order) from the logits with the logit
 * biases, then the penalties over the last repeat_last_n tokens of the
 * history (llama.cpp's order and conventions): each token seen there once
 * repetition-penalized (positive logits divided, negative multiplied), then
 * lowered by presence_penalty + count x frequency_penalty. */
static void sampler_penalize(ellm_sampler *s, const float *logits, const int32_t *hist, int n_hist) {
    const ellm_sampler_params *p = &s->p;
    int n = s->n_vocab;
    candidate *c = s->cand;
    for (int i = 0; i < n; i++) {
        c[i].id = i;
        c[i].logit = logits[i];
    }
    for (int i = 0; i < s->n_bias; i++)
        c[s->bias_id[i]].logit = s->bias[i] <= -100.0f ? -INFINITY : c[s->bias_id[i]].logit + s->bias[i];
    if (!sampler_penalizes(s, hist, n_hist)) return;
    int from = p->repeat_last_n > 0 && n_hist > p->repeat_last_n ? n_hist - p->repeat_last_n : 0;
    for (int i = from; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < n) s->count[hist[i]]++;
    for (int i = from; i < n_hist; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= n || !s->count[t]) continue; /* out of range, or done */
        float l = c[t].logit;
        if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        c[t].logit = l - p->presence_penalty - (float)s->count[t] * p->frequency_penalty;
        s->count[t] = 0;
    }
}

/* The distribution sampling draws from (temperature > 0): candidates
 * s->cand[0 .. n) with unnormalized weights s->prob[0 .. n); returns n and
 * their sum in *sum. */
static int sampler_weights(ellm_sampler *s, double *sum_out) {
    const ellm_sampler_params *p = &s->p;
    int n = s->n_vocab;
    candidate *c = s->cand;
    int k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    partial_top_k(c, n, k);
    n = k;
    /* Probabilities at temperature 1 for the top-p / min-p filters (llama.cpp
     * applies temperature last in its default chain). */
    float *pr = s->prob;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (pr[i] = expf(c[i].logit - c[0].logit));
    if (p->top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += pr[i] / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        int keep = 1; /* pr[0] is the max, = 1 */
        while (keep < n && pr[keep] >= p->min_p) keep++;
        n = keep;
    }
    sum = 0;
    for (int i = 0; i < n; i++) sum += (pr[i] = expf((c[i].logit - c[0].logit) / p->temperature));
    *sum_out = sum;
    return n;
}

/* Index of the first largest of x[0 .. n) (NaNs never win, as with a plain
 * scan). A plain scan carries the best index from one compare to the next
 * (~65 us over 49k logits); here each block of 64 gets a branch-free maximum
 * in 8 independent lanes, and only a block that beats the best so far is
 * scanned in order (~8 us). */
static int argmax_first(const float *x, int n) {
    float best_v = x[0];
    int best = 0, i = 0;
    for (; i + 64 <= n; i += 64) {
        float m[8];
        for (int k = 0; k < 8; k++) m[k] = x[i + k];
        for (int j = 8; j < 64; j += 8)
            for (int k = 0; k < 8; k++) m[k] = x[i + j + k] > m[k] ? x[i + j + k] : m[k];
        float mm = m[0];
        for (int k = 1; k < 8; k++) mm = m[k] > mm ? m[k] : mm;
        if (!(mm > best_v)) continue;
        for (int j = 0; j < 64; j++)
            if (x[i + j] > best_v) best_v = x[i + j], best = i + j;
    }
    for (; i < n; i++)
        if (x[i] > best_v) best_v = x[i], best = i;
    return best;
}

int32_t ellm_sampler_sample(ellm_sampler *s, const float *logits, const int32_t *hist, int n_hist) {
    const ellm_sampler_params *p = &s->p;
    int n = s->n_vocab;
    candidate *c = s->cand;
    if (p->temperature <= 0 && !sampler_adjusts(s, hist, n_hist)) {
        /* greedy without a bias or penalty: the first largest logit, as below, without
         * copying n_vocab candidates (a server samples every sequence each step) */
        return argmax_first(logits, n);
    }
    sampler_penalize(s, logits, hist, n_hist);
    if (p->temperature <= 0) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (c[i].logit > c[best].logit) best = i;
        return c[best].id;
    }
    double sum;
    n = sampler_weights(s, &sum);
    float *pr = s->prob;
    double u = rng_uniform(s->rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += pr[i];
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

int engine_sampler_greedy(const ellm_sampler *s) { return s->p.temperature <= 0; }

void engine_sampler_probs(ellm_sampler *s, const float *logits, const int32_t *hist, int n_hist, float *probs) {
    memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    sampler_penalize(s, logits, hist, n_hist);
    if (s->p.temperature <= 0) {
        int best = 0;
        for (int i = 1; i < s->n_vocab; i++)
            if (s->cand[i].logit > s->cand[best].logit) best = i;
        probs[best] = 1.0f;
        return;
    }
    double sum;
    int n = sampler_weights(s, &sum);
    for (int i = 0; i < n; i++) probs[s->cand[i].id] = (float)(s->prob[i] / sum);
}

double engine_sampler_uniform(ellm_sampler *s) { return rng_uniform(s->rng); }

void ellm_sampler_get_state(const ellm_sampler *s, ellm_sampler_state *out) {
    memcpy(out->rng, s->rng, sizeof out->rng);
}

void ellm_sampler_set_state(ellm_sampler *s, const ellm_sampler_state *state) {
    memcpy(s->rng, state->rng, sizeof s->rng);
}
