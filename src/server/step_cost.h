/* The time of one batched forward pass as a function of its token rows,
 * t(rows) = fixed + per_row x rows (seconds), fitted online from the passes
 * the engine runs, and the prompt rows a step may take so that sequences
 * already generating are not held up for long by new prompts.
 *
 * On a CPU a pass reads every weight once (the fixed part, memory-bound) and
 * does rows x 2 x params of arithmetic (the per-row part); a prefill chunk of
 * 128 rows costs many decode steps, so a running stream whose step carries a
 * whole chunk sees one long gap. Budgeting prompt rows per step bounds that
 * gap to `ratio` times a decode-only step, at the price of more steps for the
 * prompt (its time to first token grows by about ratio / (ratio - 1)). */
#ifndef ELLM_SERVER_STEP_COST_H
#define ELLM_SERVER_STEP_COST_H

typedef struct {
    double w, sx, sy, sxx, sxy; /* exponentially decayed sums over passes (x: rows, y: seconds) */
    double fixed_s, row_s;      /* the fit; row_s is 0 until passes of different sizes were seen */
} step_cost;

void step_cost_init(step_cost *c);
/* Adds a pass of `rows` rows that took `seconds`. */
void step_cost_add(step_cost *c, int rows, double seconds);
/* Prompt rows to add to a step of `decode_rows` generating sequences so that
 * it takes at most `ratio` (> 1) times the decode rows alone (the fixed part
 * taken as at most 16 rows' worth), within [min_rows, max_rows]; max_rows
 * when nothing generates or the fit is not known yet. */
int step_cost_prefill_budget(const step_cost *c, int decode_rows, double ratio, int min_rows, int max_rows);
/* The prompt rows a step takes: max_rows when more prompts are being
 * prefilled than sequences generate (a burst of new requests, or most
 * streams just ended: the first tokens of the many weigh more than the next
 * tokens of the few, and prompt rows go fastest in large passes), else
 * step_cost_prefill_budget. */
int step_cost_prefill_rows(const step_cost *c, int decode_seqs, int decode_rows, int n_prefilling, double ratio,
                           int min_rows, int max_rows);

#endif
