/* Exact log-sum-exp merge of partial attention states (attention.h,
 * attention_lse_*).
 *
 * Why fixed point: a float sum depends on the order of its terms, so parts
 * merged in a fixed order give fixed bits only if every merger walks all of
 * them in that order -- a process holding a shard of the KV cache would have
 * to receive every other shard's partials. Integer sums do not depend on the
 * order or the grouping. Each term e_i * acc_i[d] (e_i = expf(m_i - M), the
 * product exact in double) is scaled by a power of two and truncated to an
 * int64 once; the power is chosen from the largest term any part can give
 * (its binary exponent, from the bounds) so that the terms of every part a
 * context can have cannot overflow and the largest keeps 38 bits -- more
 * than the 24 of a float sum. Then a process may add up its own parts and send one vector of int64
 * per query row, and every grouping of the same parts gives the same bits. */
#include "attention/attention.h"

#include <math.h>
#include <string.h>

#define LOG2E 1.4426950408889634

void attention_lse_bound_init(attention_lse_bound *b) {
    b->m = b->ua = b->ul = b->last = b->neg_first = -INFINITY;
}

void attention_lse_bound_add(attention_lse_bound *b, int part, float m, float l, const float *acc, int hd) {
    if (m == -INFINITY) return; /* the row saw no key of this part */
    float mx = 0.0f;
    for (int d = 0; d < hd; d++) mx = fabsf(acc[d]) > mx ? fabsf(acc[d]) : mx;
    const double base = (double)m * LOG2E; /* log2 of exp(m) */
    if (m > b->m) b->m = m;
    if (mx > 0.0f && base + log2((double)mx) > b->ua) b->ua = base + log2((double)mx);
    if (l > 0.0f && base + log2((double)l) > b->ul) b->ul = base + log2((double)l);
    if (part > b->last) b->last = part;
    if (-part > b->neg_first) b->neg_first = -part;
}

int attention_lse_single(const attention_lse_bound *b) {
    return b->m != -INFINITY && b->last == -b->neg_first ? (int)b->last : -1;
}

/* Exponent of the grid for terms whose largest is below 2^(u - M log2 e) (u
 * a bound's log2), at most 2^ATTN_LSE_PARTS_LOG2 of them (a context of 2^30
 * tokens has 2^21 parts): the largest scaled term stays below 2^(60 -
 * ATTN_LSE_PARTS_LOG2) -- 2 bits of margin for the rounding of the bound and
 * of expf -- so any sum fits an int64, and the largest term keeps 38 bits.
 * The grid depends on the bound only, not on how many parts a tile holds. */
#define ATTN_LSE_PARTS_LOG2 22
static int grid_exp(double u, double M) {
    if (u == -INFINITY) return 0; /* every term is zero */
    double e = ceil(u - M * LOG2E) + 2 + ATTN_LSE_PARTS_LOG2 - 62;
    /* a term below 2^-900 rounds to 0 on any grid we may reach; keep 2^-e finite */
    return e < -900 ? -900 : e > 900 ? 900 : (int)e;
}

void attention_lse_grid_init(attention_lse_grid *g, const attention_lse_bound *b) {
    g->empty = b->m == -INFINITY;
    g->m = g->empty ? 0.0f : (float)b->m;
    g->ea = g->empty ? 0 : grid_exp(b->ua, b->m);
    g->el = g->empty ? 0 : grid_exp(b->ul, b->m);
    g->sa = ldexp(1.0, -g->ea);
    g->sl = ldexp(1.0, -g->el);
}

void attention_lse_sum(const attention_lse_grid *g, float m, float l, const float *acc, int hd, int64_t *sum) {
    if (g->empty || m == -INFINITY) return;
    const float e = expf(m - g->m);
    const double ea = (double)e * g->sa; /* e * 2^-ea: exact, a power of two apart */
    for (int d = 0; d < hd; d++) sum[d] += (int64_t)(ea * (double)acc[d]);
    sum[hd] += (int64_t)((double)e * g->sl * (double)l);
}

void attention_lse_out(const attention_lse_grid *g, const int64_t *sum, int hd, float *out) {
    if (g->empty || sum[hd] <= 0) { /* no key seen by this row */
        memset(out, 0, (size_t)hd * sizeof *out);
        return;
    }
    const double k = ldexp(1.0 / (double)sum[hd], g->ea - g->el);
    for (int d = 0; d < hd; d++) out[d] = (float)((double)sum[d] * k);
}

void attention_lse_one(float l, const float *acc, int hd, float *out) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = 0; d < hd; d++) out[d] = (0.0f + acc[d]) * inv;
}
