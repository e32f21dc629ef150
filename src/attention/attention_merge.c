/* Exact log-sum-exp merge of partial attention states (attention.h,
 * attention_lse_*).
 *
 * Why fixed point: a float sum depends on the order of its terms, so parts
 * merged in a fixed order give fixed bits only if every merger walks all of
 * them in that order -- a process holding a shard of the KV cache would have
 * to receive every other shard's partials. Integer sums do not depend on the
 * order or the grouping.
 *
 * Why binned: the terms are e_i acc_i[d] with e_i = exp(m_i) up to a common
 * factor. Taking that factor from the largest m of all parts (as a float
 * sum would) makes every term depend on all parts, so a process could not
 * add its own before knowing the others' maximum: one more exchange. Here
 * each term is an exact binary number of its own part only: m_i log2(e) =
 * k_i + f_i (k_i an integer, 0 <= f_i < 1), s_i = (float)2^f_i, term = s_i
 * acc_i[d] 2^k_i (the product exact in double). Its digits in base 2^W at
 * fixed (absolute) places are a function of the term alone; a row keeps the
 * two places (bins) below its largest term's and sums each bin's digits in
 * an int64 (W = 40 bits: the largest term keeps >= 41 bits, and 2^22 parts
 * cannot overflow). Sums kept for a smaller largest term move up by whole
 * bins when merged with a larger one (attention_lse_rebase): the bins that
 * survive are those of the overall largest term, whoever added what, so
 * every grouping of the same parts gives the same integers (the reproducible
 * "binned" summation of Demmel and Nguyen). */
#include "attention/attention.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#define LOG2E 1.4426950408889634
#define W ATTENTION_LSE_BIN_BITS
#define TWO_W 1099511627776.0           /* 2^W */
#define INV_TWO_W (1.0 / 1099511627776.0) /* 2^-W */
_Static_assert(W == 40, "TWO_W is 2^40");

/* k_i and s_i of a part's m (the same bits wherever it is computed). */
static void split_m(float m, int64_t *k, float *s) {
    const double c = (double)m * LOG2E, f = floor(c);
    *k = (int64_t)f;
    *s = (float)exp2(c - f);
}

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* The bin of the leading bit of v * 2^k (v > 0). */
static int64_t bin_of(double v, int64_t k) { return floor_div(k + ilogb(v), W); }

void attention_lse_bound_init(attention_lse_bound *b) {
    b->ta = b->tl = ATTENTION_LSE_NONE;
    b->last = b->neg_first = INT64_MIN;
}

void attention_lse_bound_add(attention_lse_bound *b, int part, float m, float l, const float *acc, int hd) {
    if (m == -INFINITY) return; /* the row saw no key of this part */
    int64_t k;
    float s;
    split_m(m, &k, &s);
    float mx = 0.0f;
    for (int d = 0; d < hd; d++) mx = fabsf(acc[d]) > mx ? fabsf(acc[d]) : mx;
    if (mx > 0.0f) {
        int64_t t = bin_of((double)s * (double)mx, k);
        if (t > b->ta) b->ta = t;
    }
    if (l > 0.0f) {
        int64_t t = bin_of((double)s * (double)l, k);
        if (t > b->tl) b->tl = t;
    }
    if (part > b->last) b->last = part;
    if (-(int64_t)part > b->neg_first) b->neg_first = -(int64_t)part;
}

void attention_lse_bound_merge(attention_lse_bound *b, const attention_lse_bound *o) {
    if (o->ta > b->ta) b->ta = o->ta;
    if (o->tl > b->tl) b->tl = o->tl;
    if (o->last > b->last) b->last = o->last;
    if (o->neg_first > b->neg_first) b->neg_first = o->neg_first;
}

int attention_lse_single(const attention_lse_bound *b) {
    return b->last != INT64_MIN && b->last == -b->neg_first ? (int)b->last : -1;
}

void attention_lse_grid_init(attention_lse_grid *g, const attention_lse_bound *b) {
    g->empty = b->tl == ATTENTION_LSE_NONE; /* every row with a key has l > 0 */
    g->ta = b->ta;
    g->tl = b->tl;
}

/* 2^(k - (top - 1) W): the factor that puts a term's bins top and top - 1
 * in [2^W, 2^2W) and [1, 2^W). Clamped where the result no longer matters:
 * below, every digit truncates to 0; above, only for a part whose values are
 * all zero (a nonzero one is at most 2^(2W) by the choice of top). */
static double bin_scale(int64_t k, int64_t top) {
    if (top == ATTENTION_LSE_NONE) return 0.0;
    int64_t e = k - (top - 1) * W;
    return e < -1100 ? 0.0 : ldexp(1.0, e > 1000 ? 1000 : (int)e);
}

/* Adds the digits of y (< 2^2W in magnitude) in its two bins. */
static inline void deposit(double y, int64_t *two) {
    const int64_t hi = (int64_t)(y * INV_TWO_W);
    two[0] += hi;
    two[1] += (int64_t)(y - (double)hi * TWO_W);
}

void attention_lse_sum(const attention_lse_grid *g, float m, float l, const float *acc, int hd, int64_t *sum) {
    if (g->empty || m == -INFINITY) return;
    int64_t k;
    float s;
    split_m(m, &k, &s);
    const double sa = (double)s * bin_scale(k, g->ta); /* s * 2^..: exact, a power of two apart */
    if (sa != 0.0)
        for (int d = 0; d < hd; d++) deposit((double)acc[d] * sa, sum + 2 * d);
    deposit((double)l * ((double)s * bin_scale(k, g->tl)), sum + 2 * hd);
}

/* Sums of bins top, top - 1 moved to bins top + by, top + by - 1. */
static void rebase_pairs(int64_t *two, int n, int64_t by) {
    if (by <= 0) return;
    for (int i = 0; i < n; i++) {
        two[2 * i + 1] = by == 1 ? two[2 * i] : 0;
        two[2 * i] = 0;
    }
}

void attention_lse_rebase(const attention_lse_grid *from, const attention_lse_grid *to, int64_t *sum, int hd) {
    if (from->ta != ATTENTION_LSE_NONE) rebase_pairs(sum, hd, to->ta - from->ta);
    if (from->tl != ATTENTION_LSE_NONE) rebase_pairs(sum + 2 * hd, 1, to->tl - from->tl);
}

/* hi 2^W + lo, rounded once to double. */
static double pair_value(const int64_t *two) { return (double)((__int128)two[0] * (1LL << W) + two[1]); }

void attention_lse_out(const attention_lse_grid *g, const int64_t *sum, int hd, float *out) {
    const double L = g->empty ? 0.0 : pair_value(sum + 2 * hd);
    if (!(L > 0.0) || g->ta == ATTENTION_LSE_NONE) { /* no key seen, or every value zero */
        memset(out, 0, (size_t)hd * sizeof *out);
        return;
    }
    const int64_t de = (g->ta - g->tl) * W;
    const double k = ldexp(1.0 / L, de < -2000 ? -2000 : de > 2000 ? 2000 : (int)de);
    for (int d = 0; d < hd; d++) out[d] = (float)(pair_value(sum + 2 * d) * k);
}

void attention_lse_one(float l, const float *acc, int hd, float *out) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = 0; d < hd; d++) out[d] = (0.0f + acc[d]) * inv;
}
