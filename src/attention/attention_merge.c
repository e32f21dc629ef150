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
#include "core/cpu.h"

#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#define LOG2E 1.4426950408889634
#define W ATTENTION_LSE_BIN_BITS
#define TWO_W 1099511627776.0           /* 2^W */
#define INV_TWO_W (1.0 / 1099511627776.0) /* 2^-W */
_Static_assert(W == 40, "TWO_W is 2^40");

/* k_i and s_i of a part's m (the same bits wherever it is computed; m is
 * finite). */
static inline void split_m(float m, int64_t *k, float *s) {
    double c = (double)m * LOG2E;
    c = c > 1e17 ? 1e17 : c < -1e17 ? -1e17 : c; /* keeps the int64 conversion defined */
    int64_t f = (int64_t)c;
    f -= (double)f > c; /* floor */
    *k = f;
    *s = exp2f((float)(c - (double)f));
}

static inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* The binary exponent of v > 0 (ilogb, read from the bits when normal). */
static inline int exponent_of(double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    const int e = (int)((u >> 52) & 0x7ff);
    return e ? e - 1023 : ilogb(v);
}

/* 2^e as a double, e within [-1074, 1023]. */
static inline double pow2(int e) {
    if (e < -1022) return ldexp(1.0, e);
    const uint64_t u = (uint64_t)(e + 1023) << 52;
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* The bin of the leading bit of v * 2^k (v > 0). */
static inline int64_t bin_of(double v, int64_t k) { return floor_div(k + exponent_of(v), W); }

void attention_lse_bound_init(attention_lse_bound *b) {
    b->ta = b->tl = ATTENTION_LSE_NONE;
    b->last = b->neg_first = INT64_MIN;
}

/* Folds a part whose split of m is (k, s) into b. */
static void bound_add_split(attention_lse_bound *b, int part, int64_t k, float s, float l, const float *acc, int hd) {
    /* max |acc|: 8 independent chains (one is latency-bound); any order gives the same max */
    float m8[8] = {0};
    int d = 0;
    for (; d + 8 <= hd; d += 8)
        for (int j = 0; j < 8; j++) m8[j] = fabsf(acc[d + j]) > m8[j] ? fabsf(acc[d + j]) : m8[j];
    for (; d < hd; d++) m8[0] = fabsf(acc[d]) > m8[0] ? fabsf(acc[d]) : m8[0];
    float mx = 0.0f;
    for (int j = 0; j < 8; j++) mx = m8[j] > mx ? m8[j] : mx;
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

void attention_lse_bound_add(attention_lse_bound *b, int part, float m, float l, const float *acc, int hd) {
    if (m == -INFINITY) return; /* the row saw no key of this part */
    int64_t k;
    float s;
    split_m(m, &k, &s);
    bound_add_split(b, part, k, s, l, acc, hd);
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
    return e < -1074 ? 0.0 : pow2(e > 1000 ? 1000 : (int)e);
}

/* Adds the digits of y = x * sc (< 2^2W in magnitude) in its two bins, hi
 * and lo. Every step is exact (x * sc: 24-bit values a power of two apart;
 * hi 2^W: 40 bits), so any ISA gives the same integers. */
static inline void deposit(double y, int64_t *hi, int64_t *lo) {
    const int64_t h = (int64_t)(y * INV_TWO_W);
    *hi += h;
    *lo += (int64_t)(y - (double)h * TWO_W);
}

static void deposit_row_scalar(const float *x, double sc, int n, int64_t *hi, int64_t *lo) {
    for (int d = 0; d < n; d++) deposit((double)x[d] * sc, &hi[d], &lo[d]);
}

/* The same, 8 values at a time (AVX-512 F + DQ: double <-> int64). */
__attribute__((target("avx512f,avx512dq"))) static void deposit_row_avx512(const float *x, double sc, int n,
                                                                           int64_t *hi, int64_t *lo) {
    const __m512d vs = _mm512_set1_pd(sc), inv = _mm512_set1_pd(INV_TWO_W), tw = _mm512_set1_pd(TWO_W);
    int d = 0;
    for (; d + 8 <= n; d += 8) {
        const __m512d y = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + d)), vs);
        const __m512i h = _mm512_cvttpd_epi64(_mm512_mul_pd(y, inv));
        const __m512i l = _mm512_cvttpd_epi64(_mm512_sub_pd(y, _mm512_mul_pd(_mm512_cvtepi64_pd(h), tw)));
        _mm512_storeu_si512(hi + d, _mm512_add_epi64(_mm512_loadu_si512(hi + d), h));
        _mm512_storeu_si512(lo + d, _mm512_add_epi64(_mm512_loadu_si512(lo + d), l));
    }
    deposit_row_scalar(x + d, sc, n - d, hi + d, lo + d);
}

/* Adds a part whose split of m is (k, s) into sum on grid g (not empty). */
static void sum_split(const attention_lse_grid *g, int64_t k, float s, float l, const float *acc, int hd,
                      int64_t *sum) {
    int64_t *hi = sum, *lo = sum + hd + 1; /* planar: hi digits of acc then l, then lo digits */
    const double sa = (double)s * bin_scale(k, g->ta); /* s * 2^..: exact, a power of two apart */
    if (sa != 0.0) {
        if (ellm_cpu_isa() == ELLM_ISA_AVX512) deposit_row_avx512(acc, sa, hd, hi, lo);
        else deposit_row_scalar(acc, sa, hd, hi, lo);
    }
    deposit((double)l * ((double)s * bin_scale(k, g->tl)), &hi[hd], &lo[hd]);
}

void attention_lse_sum(const attention_lse_grid *g, float m, float l, const float *acc, int hd, int64_t *sum) {
    if (g->empty || m == -INFINITY) return;
    int64_t k;
    float s;
    split_m(m, &k, &s);
    sum_split(g, k, s, l, acc, hd, sum);
}

/* Sums of bins top, top - 1 (hi[i], lo[i]) moved to bins top + by and
 * top + by - 1. */
static void rebase_bins(int64_t *hi, int64_t *lo, int n, int64_t by) {
    if (by <= 0) return;
    for (int i = 0; i < n; i++) {
        lo[i] = by == 1 ? hi[i] : 0;
        hi[i] = 0;
    }
}

void attention_lse_rebase(const attention_lse_grid *from, const attention_lse_grid *to, int64_t *sum, int hd) {
    if (from->ta != ATTENTION_LSE_NONE) rebase_bins(sum, sum + hd + 1, hd, to->ta - from->ta);
    if (from->tl != ATTENTION_LSE_NONE) rebase_bins(sum + hd, sum + 2 * hd + 1, 1, to->tl - from->tl);
}

void attention_lse_accumulate(attention_lse_bound *b, attention_lse_grid *g, int64_t *sum, int part, float m, float l,
                              const float *acc, int hd) {
    if (m == -INFINITY) return;
    int64_t k;
    float s;
    split_m(m, &k, &s); /* once for the bound and the sum */
    const attention_lse_grid was = *g;
    bound_add_split(b, part, k, s, l, acc, hd);
    attention_lse_grid_init(g, b);
    attention_lse_rebase(&was, g, sum, hd);
    if (!g->empty) sum_split(g, k, s, l, acc, hd, sum);
}

/* hi 2^W + lo as a double (the same bits for the same integers). */
static inline double bins_value(int64_t hi, int64_t lo) { return (double)hi * TWO_W + (double)lo; }

void attention_lse_out(const attention_lse_grid *g, const int64_t *sum, int hd, float *out) {
    const double L = g->empty ? 0.0 : bins_value(sum[hd], sum[2 * hd + 1]);
    if (!(L > 0.0) || g->ta == ATTENTION_LSE_NONE) { /* no key seen, or every value zero */
        memset(out, 0, (size_t)hd * sizeof *out);
        return;
    }
    const int64_t de = (g->ta - g->tl) * W;
    const double k = ldexp(1.0 / L, de < -2000 ? -2000 : de > 2000 ? 2000 : (int)de);
    for (int d = 0; d < hd; d++) out[d] = (float)(bins_value(sum[d], sum[hd + 1 + d]) * k);
}

void attention_lse_one(float l, const float *acc, int hd, float *out) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = 0; d < hd; d++) out[d] = (0.0f + acc[d]) * inv;
}
