/* Online linear fit of pass time against rows (see step_cost.h). */
#include "server/step_cost.h"

/* Each pass's weight in the sums decays by this factor per later pass: the
 * fit follows the last ~50 passes, so it tracks a machine whose load changes. */
#define DECAY 0.98
/* Below this variance of the row counts (rows^2) the passes are all about the
 * same size and say nothing about the slope: the last slope is kept. */
#define MIN_VAR_ROWS2 4.0
/* The most rows' worth of arithmetic the fixed part of a pass is taken to be. */
#define FIXED_ROWS_MAX 16.0

void step_cost_init(step_cost *c) { *c = (step_cost){0}; }

void step_cost_add(step_cost *c, int rows, double seconds) {
    if (rows < 1 || !(seconds > 0)) return;
    const double x = rows, y = seconds;
    c->w = c->w * DECAY + 1;
    c->sx = c->sx * DECAY + x;
    c->sy = c->sy * DECAY + y;
    c->sxx = c->sxx * DECAY + x * x;
    c->sxy = c->sxy * DECAY + x * y;
    const double mx = c->sx / c->w, my = c->sy / c->w;
    const double var = c->sxx / c->w - mx * mx, cov = c->sxy / c->w - mx * my;
    if (var > MIN_VAR_ROWS2 && cov > 0) c->row_s = cov / var;
    if (c->row_s > 0) {
        c->fixed_s = my - c->row_s * mx;
        if (c->fixed_s < 0) c->fixed_s = 0; /* noise; a pass has no negative cost */
    }
}

int step_cost_prefill_budget(const step_cost *c, int decode_rows, double ratio, int min_rows, int max_rows) {
    if (decode_rows <= 0 || c->row_s <= 0 || ratio <= 1) return max_rows;
    /* the budget is (ratio - 1) x (fixed / per_row + decode_rows) rows; the
     * fixed part, reading the weights, costs a few rows of arithmetic on a
     * CPU (about 5 for a 135M Q8_0 model on 2 Zen 4 cores), so a fit saying
     * more than FIXED_ROWS_MAX came from noisy passes and is capped */
    double fixed_rows = c->fixed_s / c->row_s;
    if (fixed_rows > FIXED_ROWS_MAX) fixed_rows = FIXED_ROWS_MAX;
    const double k = (ratio - 1) * (fixed_rows + decode_rows);
    int rows = k >= max_rows ? max_rows : (int)k;
    if (rows < min_rows) rows = min_rows;
    return rows < max_rows ? rows : max_rows;
}

int step_cost_prefill_rows(const step_cost *c, int decode_seqs, int decode_rows, int n_prefilling, double ratio,
                           int min_rows, int max_rows) {
    if (n_prefilling > decode_seqs) return max_rows;
    return step_cost_prefill_budget(c, decode_rows, ratio, min_rows, max_rows);
}
