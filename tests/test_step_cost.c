/* The server's pass-time model (src/server/step_cost.c): the fit recovers a
 * known fixed + per-row cost from passes of mixed sizes, keeps its slope while
 * every pass has the same size, and turns it into a prompt-row budget (the
 * whole chunk for a burst of prompts). */
#include "server/step_cost.h"
#include "harness.h"

#include <math.h>

int main(void) {
    step_cost c;
    step_cost_init(&c);
    CHECK(step_cost_prefill_budget(&c, 8, 2.5, 16, 128) == 128, "no fit yet: the whole chunk");

    /* 12 ms to read the weights, 1.8 ms a row: decode steps of 1..16 rows and
     * prompt chunks of 128 */
    for (int i = 0; i < 200; i++) {
        int rows = i % 10 == 0 ? 128 : 1 + i % 16;
        step_cost_add(&c, rows, 0.012 + 0.0018 * rows);
    }
    CHECK(fabs(c.row_s - 0.0018) < 1e-6 && fabs(c.fixed_s - 0.012) < 1e-5, "fit %.6f + %.6f x rows", c.fixed_s, c.row_s);

    /* 8 decode rows alone: 26.4 ms; at 2.5x (66 ms) a step holds 1.5 x 26.4 / 1.8 = 22 prompt rows */
    int k = step_cost_prefill_budget(&c, 8, 2.5, 16, 128);
    CHECK(k == 21 || k == 22, "budget for 8 decode rows at 2.5x: %d", k);
    CHECK(step_cost_prefill_budget(&c, 0, 2.5, 16, 128) == 128, "nothing generating: the whole chunk");
    CHECK(step_cost_prefill_budget(&c, 1, 1.5, 16, 128) == 16, "never below min_rows");
    CHECK(step_cost_prefill_budget(&c, 16, 50, 16, 128) == 128, "never above max_rows");
    /* one prompt among 8 generating sequences: the budget; more prompts than
     * generating sequences: the whole chunk */
    CHECK(step_cost_prefill_rows(&c, 8, 8, 1, 2.5, 16, 128) == k, "one prompt among 8 streams gets the budget");
    CHECK(step_cost_prefill_rows(&c, 8, 8, 8, 2.5, 16, 128) == k, "as many prompts as streams: the budget");
    CHECK(step_cost_prefill_rows(&c, 2, 2, 14, 2.5, 16, 128) == 128, "14 prompts, 2 streams: the whole chunk");
    CHECK(step_cost_prefill_rows(&c, 2, 10, 3, 2.5, 16, 128) == 128,
          "3 prompts, 2 speculative streams of 5 rows: the whole chunk");

    /* steady decode of 8 rows only: the slope stays */
    for (int i = 0; i < 400; i++) step_cost_add(&c, 8, 0.012 + 0.0018 * 8);
    CHECK(fabs(c.row_s - 0.0018) < 1e-6 && fabs(c.fixed_s - 0.012) < 1e-5, "fit kept when all passes have one size: %.6f + %.6f x rows", c.fixed_s, c.row_s);

    /* a machine twice as slow (other work on the cores): the fit follows */
    for (int i = 0; i < 400; i++) {
        int rows = i % 10 == 0 ? 128 : 1 + i % 16;
        step_cost_add(&c, rows, 2 * (0.012 + 0.0018 * rows));
    }
    CHECK(fabs(c.row_s - 0.0036) < 1e-5 && fabs(c.fixed_s - 0.024) < 1e-4, "fit follows a slower machine: %.6f + %.6f x rows", c.fixed_s, c.row_s);

    /* a fit whose fixed part is many rows' worth (noisy passes) is capped at
     * 16 rows: 8 decode rows at 2.5x take at most 1.5 x (16 + 8) = 36 prompt rows */
    step_cost cn;
    step_cost_init(&cn);
    for (int i = 0; i < 100; i++) step_cost_add(&cn, i % 2 ? 8 : 40, 0.060 + 0.0005 * (i % 2 ? 8 : 40));
    CHECK(cn.fixed_s / cn.row_s > 100, "a fit with a large fixed part: %.4f + %.5f x rows", cn.fixed_s, cn.row_s);
    k = step_cost_prefill_budget(&cn, 8, 2.5, 16, 128);
    CHECK(k == 36, "budget with the fixed part capped at 16 rows: %d", k);

    /* nonsense samples are ignored */
    step_cost cz;
    step_cost_init(&cz);
    step_cost_add(&cz, 0, 1.0);
    step_cost_add(&cz, 4, -1.0);
    step_cost_add(&cz, 4, NAN);
    CHECK(cz.w == 0, "rows < 1, negative or NaN times are not samples");
    return test_finish();
}
