/* Error-feedback rounding (gptq.h). Hot loops are plain float loops that
 * this file's -O3 (Makefile) vectorizes. */
#include "convert/gptq.h"
#include "core/fp16.h"
#include "core/linalg.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int gptq_prepare(const float *cov, int64_t cols, int B, double damp, float *H, float *U) {
    double *a = malloc((size_t)B * B * sizeof *a), *inv = malloc((size_t)B * B * sizeof *inv),
           *w = malloc((size_t)B * B * sizeof *w);
    int ok = a && inv && w;
    for (int64_t c0 = 0; c0 < cols && ok; c0 += B) {
        const int n = cols - c0 < B ? (int)(cols - c0) : B;
        double mean = 0;
        for (int i = 0; i < n; i++) mean += cov[(size_t)(c0 + i) * B + i];
        mean /= n;
        if (!(mean > 0)) mean = 1;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double v = cov[(size_t)(c0 + i) * B + j];
                if (i == j) v += damp * mean + (v > 0 ? 0 : mean); /* a column never seen gets weight */
                a[(size_t)i * n + j] = v;
                H[(size_t)(c0 + i) * B + j] = (float)v;
            }
        for (int i = 0; i < n; i++)
            for (int j = n; j < B; j++) H[(size_t)(c0 + i) * B + j] = 0;
        /* H^-1 = M M^T (M lower); U = M^T (upper) is what the rounding walks */
        ok = !linalg_cholesky(a, n, 0);
        if (ok) linalg_cholesky_inverse(a, inv, w, n);
        ok = ok && !linalg_cholesky(inv, n, 0);
        for (int i = 0; i < n && ok; i++)
            for (int j = 0; j < B; j++)
                U[(size_t)(c0 + i) * B + j] = j >= i && j < n ? (float)inv[(size_t)j * n + i] : 0;
    }
    free(a);
    free(inv);
    free(w);
    return ok;
}

/* Widest covariance block the rounding takes, and the most groups in it. */
#define GPTQ_MAX_B 1024
#define GPTQ_MAX_G (GPTQ_MAX_B / QK4_0)

/* Error-feedback passes per block: the first fits each group's grid as it
 * reaches it, the next ones keep the refitted grid. On the evaluation model
 * 3 passes lowered the KL divergence from F32 against 1, and 2 measured
 * within 1% of 3 (bench/CONVERT.md). */
#define GPTQ_PASSES 3

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The quantization grid of one block: per group of G columns (Q4_0: 32,
 * scale d, m = 0; INT4_G128: 128, scale d and offset m). */
typedef struct {
    int type, G;
    float d[GPTQ_MAX_G], m[GPTQ_MAX_G];
} gptq_grid;

/* One thread's scratch (gptq.h). */
struct gptq_scratch {
    float w[GPTQ_MAX_B];              /* the values as the pass updates them */
    float lev[GPTQ_MAX_B];            /* levels as floats */
    float e[GPTQ_MAX_B];              /* errors of a candidate */
    float hc[GPTQ_MAX_G * GPTQ_MAX_B]; /* refit: H times each parameter's column (at most
                                        * GPTQ_MAX_G parameters: Q4_0 n / 32, INT4_G128 n / 64) */
    int64_t n;                        /* columns of wimp */
    float *wimp;                      /* the row's importance weights */
};

gptq_scratch *gptq_scratch_new(int64_t n) {
    gptq_scratch *S = malloc(sizeof *S);
    if (!S) return NULL;
    S->n = n;
    S->wimp = malloc((size_t)(n > 0 ? n : 1) * sizeof *S->wimp);
    if (!S->wimp) {
        free(S);
        return NULL;
    }
    return S;
}

void gptq_scratch_free(gptq_scratch *S) {
    if (!S) return;
    free(S->wimp);
    free(S);
}

/* Partial sums per lane: a float sum is not reassociated by the compiler,
 * so the lanes are spelled out for it to vectorize. n: a multiple of
 * GPTQ_LANES (every block and group is a multiple of 32). */
#define GPTQ_LANES 16

static inline float lanes_sum(const float *acc) {
    float s = 0;
    for (int l = 0; l < GPTQ_LANES; l++) s += acc[l];
    return s;
}

static inline float dot(const float *a, const float *b, int n) {
    float acc[GPTQ_LANES] = {0};
    for (int j = 0; j < n; j += GPTQ_LANES)
        for (int l = 0; l < GPTQ_LANES; l++) acc[l] += a[j + l] * b[j + l];
    return lanes_sum(acc);
}

static inline float sum(const float *a, int n) {
    float acc[GPTQ_LANES] = {0};
    for (int j = 0; j < n; j += GPTQ_LANES)
        for (int l = 0; l < GPTQ_LANES; l++) acc[l] += a[j + l];
    return lanes_sum(acc);
}

/* sum_i e_i (H e)_i over n columns (H rows of stride B). */
static double quad_form(const float *e, const float *H, int n, int B) {
    double E = 0;
    for (int i = 0; i < n; i++) E += (double)e[i] * dot(H + (size_t)i * B, e, n);
    return E;
}

static double block_err(const float *x, const gptq_grid *g, const float *lev, int n, const float *H, int B,
                        gptq_scratch *S) {
    for (int i = 0; i < n; i++) S->e[i] = x[i] - (g->d[i / g->G] * lev[i] + g->m[i / g->G]);
    return quad_form(S->e, H, n, B);
}

/* The element-wise weighted quantizer's grid and levels for group k of
 * values v (G of them, weights w). */
static void plain_group(gptq_grid *g, int k, const float *v, const float *w, float *lev) {
    if (g->type == QTYPE_Q4_0) {
        block_q4_0 t;
        qtype_fit_q4_0_weighted(v, &t, QK4_0, w);
        g->d[k] = ellm_f16_to_f32(t.d);
        g->m[k] = 0;
        for (int i = 0; i < QK4_0 / 2; i++) {
            lev[i] = (float)((t.qs[i] & 0xF) - 8);
            lev[i + 16] = (float)((t.qs[i] >> 4) - 8);
        }
    } else {
        block_int4_g128 t;
        qtype_fit_int4_g128_group(v, w, 10, &t);
        g->d[k] = ellm_f16_to_f32(t.d);
        g->m[k] = ellm_f16_to_f32(t.m);
        for (int i = 0; i < QK_G128 / 2; i++) {
            lev[i] = (float)(t.qs[i] & 0xF);
            lev[i + 64] = (float)(t.qs[i] >> 4);
        }
    }
}

/* One error-feedback pass over x[0, n): each element is rounded on the grid
 * after the rounding errors of the elements before it were fed forward
 * through U; with `choose`, each group's grid is first fitted by the plain
 * quantizer to its values as they stand when the pass reaches it (g must
 * then hold the plain fit of group 0, which feedback has not reached). */
static void feedback_pass(const float *x, const float *wimp, int n, const float *U, int B, gptq_grid *g, int choose,
                          gptq_scratch *S) {
    float tmp[QK_G128];
    const int lo = g->type == QTYPE_Q4_0 ? -8 : 0, hi = lo + 15;
    float *w = S->w;
    memcpy(w, x, (size_t)n * sizeof *w);
    for (int i = 0; i < n; i++) {
        const int k = i / g->G;
        /* group 0 is not yet touched by feedback: its grid is already the
         * plain fit of the same values (quantize_block's first candidate) */
        if (choose && i % g->G == 0 && k > 0) plain_group(g, k, w + i, wimp + i, tmp);
        const float d = g->d[k], m = g->m[k];
        const int q = d != 0 ? clampi((int)lrintf((w[i] - m) / d), lo, hi) : 0;
        S->lev[i] = (float)q;
        const float err = (w[i] - (d * (float)q + m)) / U[(size_t)i * B + i];
        const float *u = U + (size_t)i * B;
        for (int j = i + 1; j < n; j++) w[j] -= err * u[j];
    }
}

/* Least-squares refit of the grid for the levels in S->lev against e^T H e
 * (x the original values): all the block's scales (and INT4_G128's offsets)
 * together, then rounded to F16. Returns e^T H e of the refitted grid, or -1
 * (grid unchanged) if the system is singular or a value leaves F16's range.
 * With y the parameters, A = C^T H C and b = C^T H x for the parameters'
 * columns C: e^T H e = x^T H x - 2 y.b + y^T A y (xhx = x^T H x). */
static double refit(const float *x, double xhx, const float *H, int n, int B, gptq_grid *g, gptq_scratch *S) {
    const int G = g->G, ng = n / G, per = g->type == QTYPE_Q4_0 ? 1 : 2, np = ng * per;
    double A[GPTQ_MAX_G * GPTQ_MAX_G], b[GPTQ_MAX_G], y[GPTQ_MAX_G];
    const float *lev = S->lev;
    /* hc[p][i] = (H C)_ip: parameter p = (group p / per, levels or ones) */
    for (int i = 0; i < n; i++) {
        const float *h = H + (size_t)i * B;
        for (int k = 0; k < ng; k++) {
            S->hc[(size_t)(k * per) * n + i] = dot(h + k * G, lev + k * G, G);
            if (per == 2) S->hc[(size_t)(k * per + 1) * n + i] = sum(h + k * G, G);
        }
    }
    for (int p = 0; p < np; p++) {
        const float *h = S->hc + (size_t)p * n;
        b[p] = dot(h, x, n);
        for (int r = 0; r < np; r++) {
            const int j0 = r / per * G;
            A[p * np + r] = r % per ? sum(h + j0, G) : dot(h + j0, lev + j0, G);
        }
    }
    /* symmetrize the float sums, keep a copy for the error */
    double A0[GPTQ_MAX_G * GPTQ_MAX_G];
    for (int p = 0; p < np; p++)
        for (int r = 0; r < p; r++) A[p * np + r] = A[r * np + p] = 0.5 * (A[p * np + r] + A[r * np + p]);
    memcpy(A0, A, (size_t)np * np * sizeof *A);
    if (linalg_cholesky(A, np, 0)) return -1;
    memcpy(y, b, (size_t)np * sizeof *y);
    linalg_cholesky_solve(A, y, np, 1);
    gptq_grid t = *g;
    for (int k = 0; k < ng; k++) {
        t.d[k] = ellm_f16_to_f32(ellm_f32_to_f16((float)y[k * per]));
        t.m[k] = per == 2 ? ellm_f16_to_f32(ellm_f32_to_f16((float)y[k * per + 1])) : 0.0f;
        if (!isfinite(t.d[k]) || !isfinite(t.m[k]) || (per == 2 && !(t.d[k] > 0))) return -1;
        y[k * per] = t.d[k];
        if (per == 2) y[k * per + 1] = t.m[k];
    }
    *g = t;
    double E = xhx;
    for (int p = 0; p < np; p++) {
        double s = 0;
        for (int r = 0; r < np; r++) s += A0[p * np + r] * y[r];
        E += y[p] * s - 2.0 * y[p] * b[p];
    }
    return E;
}

/* One block of n columns of a row. */
static void quantize_block(int type, const float *x, const float *wimp, int n, const float *H, const float *U, int B,
                           gptq_scratch *S, uint8_t *out) {
    float best_lev[GPTQ_MAX_B];
    gptq_grid g = {.type = type, .G = type == QTYPE_Q4_0 ? QK4_0 : QK_G128}, best;
    const int ng = n / g.G;
    for (int k = 0; k < ng; k++) plain_group(&g, k, x + k * g.G, wimp + k * g.G, best_lev + k * g.G);
    double bestE = block_err(x, &g, best_lev, n, H, B, S);
    best = g;
    const double xhx = quad_form(x, H, n, B);
    for (int pass = 0; pass < GPTQ_PASSES; pass++) {
        feedback_pass(x, wimp, n, U, B, &g, pass == 0, S);
        /* the refit can only lower the pass's error (up to the F16
         * rounding), so only a failed refit needs the pass's own */
        double E = refit(x, xhx, H, n, B, &g, S);
        const int failed = E < 0;
        if (failed) E = block_err(x, &g, S->lev, n, H, B, S);
        if (E < bestE) {
            bestE = E;
            best = g;
            memcpy(best_lev, S->lev, (size_t)n * sizeof *best_lev);
        }
        if (failed) break;
    }
    if (type == QTYPE_Q4_0) {
        block_q4_0 *b = (block_q4_0 *)out;
        for (int k = 0; k < ng; k++) {
            const float *l = best_lev + k * QK4_0;
            b[k].d = ellm_f32_to_f16(best.d[k]);
            for (int i = 0; i < QK4_0 / 2; i++) b[k].qs[i] = (uint8_t)(((int)l[i] + 8) | (((int)l[i + 16] + 8) << 4));
        }
    } else {
        block_int4_g128 *b = (block_int4_g128 *)out;
        for (int k = 0; k < ng; k++) {
            const float *l = best_lev + k * QK_G128;
            b[k].d = ellm_f32_to_f16(best.d[k]);
            b[k].m = ellm_f32_to_f16(best.m[k]);
            for (int i = 0; i < QK_G128 / 2; i++) b[k].qs[i] = (uint8_t)((int)l[i] | ((int)l[i + 64] << 4));
        }
    }
}

int gptq_quantize_row(int type, const float *x, void *dst, int64_t n, const float *imatrix, const float *H,
                      const float *U, int B, gptq_scratch *S) {
    const int G = type == QTYPE_Q4_0 ? QK4_0 : QK_G128;
    if ((type != QTYPE_Q4_0 && type != QTYPE_INT4_G128) || B <= 0 || B > GPTQ_MAX_B || B % G || n % G || n > S->n)
        return 0;
    float *w = S->wimp;
    qtype_importance_weights(x, imatrix, n, w);
    const size_t blk = type == QTYPE_Q4_0 ? sizeof(block_q4_0) : sizeof(block_int4_g128);
    for (int64_t c0 = 0; c0 < n; c0 += B) {
        const int nb = n - c0 < B ? (int)(n - c0) : B;
        quantize_block(type, x + c0, w + c0, nb, H + c0 * B, U + c0 * B, B, S, (uint8_t *)dst + (size_t)(c0 / G) * blk);
    }
    return 1;
}
