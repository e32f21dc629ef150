/* Sparse-budget calibration: measure how much attention mass block selection
 * captures per layer and KV head at several budgets, then allocate a total
 * budget across heads where it buys the most recall. */
#include "core/status.h"
#include "engine/engine_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ellm_status ellm_sparse_calibrate(ellm_context *ctx, const int32_t *tokens, int n, const int *budgets,
                                  int n_budgets, int sample_every, double *sum, int64_t *n_samples,
                                  ellm_error *err) {
    if (!ctx->sidx) return ellm_fail(err, ELLM_ERR_ARG, "calibrate: this context has no sparse index");
    if (ctx->dist)
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "calibrate: reads every key; not supported with the KV cache sharded over MPI ranks");
    if (n_budgets < 1 || sample_every < 1) return ellm_fail(err, ELLM_ERR_ARG, "calibrate: no budgets or bad sampling");
    int saved_topk = ctx->sparse_topk;
    ctx->sparse_topk = 0; /* measure on dense attention */
    ellm_context_truncate(ctx, 0);
    struct engine_calib hook = {budgets, n_budgets, sample_every, sum, n_samples};
    ctx->calib = &hook;
    ellm_status st = ELLM_OK;
    for (int i = 0; i < n && st == ELLM_OK; i++) st = ellm_decode(ctx, &tokens[i], 1, NULL, err);
    ctx->calib = NULL;
    ctx->sparse_topk = saved_topk;
    return st;
}

/* Recall of curve (budgets, r) at budget x, linear between points, flat past the ends. */
static double curve_at(const int *budgets, const double *r, int nb, double x) {
    if (x <= budgets[0]) return r[0] * x / budgets[0];
    for (int i = 1; i < nb; i++)
        if (x <= budgets[i])
            return r[i - 1] + (r[i] - r[i - 1]) * (x - budgets[i - 1]) / (budgets[i] - budgets[i - 1]);
    return r[nb - 1];
}

ellm_status ellm_sparse_profile_write(const char *path, int n_layer, int n_kv_head, const int *budgets,
                                      int n_budgets, const double *mean_recall, int target,
                                      int n_dense_layers, ellm_error *err) {
    if (n_layer < 1 || n_kv_head < 1 || n_budgets < 1 || target < 1)
        return ellm_fail(err, ELLM_ERR_ARG, "profile: bad shape or target");
    int nlh = n_layer * n_kv_head;
    double *alloc = calloc((size_t)nlh, sizeof *alloc);
    unsigned char *dense = calloc((size_t)n_layer, 1);
    if (!alloc || !dense) {
        free(alloc);
        free(dense);
        return ellm_fail(err, ELLM_ERR_NOMEM, "profile: out of memory");
    }
    /* The layers whose recall at the largest budget is lowest stay dense. */
    for (int k = 0; k < n_dense_layers && k < n_layer; k++) {
        int worst = -1;
        double worst_r = 2;
        for (int l = 0; l < n_layer; l++) {
            if (dense[l]) continue;
            double r = 0;
            for (int h = 0; h < n_kv_head; h++) r += mean_recall[((size_t)l * n_kv_head + h) * n_budgets + n_budgets - 1];
            if (r < worst_r) worst_r = r, worst = l;
        }
        if (worst >= 0) dense[worst] = 1;
    }
    /* Greedy: every sparse head starts at the smallest budget; steps of one
     * 32-token block go to the head with the largest recall gain until the
     * mean reaches the target. Concave curves make this optimal. */
    const double step = 32;
    int n_sparse = 0;
    for (int l = 0; l < n_layer; l++)
        for (int h = 0; h < n_kv_head; h++)
            if (!dense[l]) {
                alloc[l * n_kv_head + h] = budgets[0] < target ? budgets[0] : target;
                n_sparse++;
            }
    double total = 0;
    for (int i = 0; i < nlh; i++) total += alloc[i];
    double goal = (double)target * n_sparse, cap = 4.0 * target;
    while (total + step <= goal + 1e-9) {
        int best = -1;
        double best_gain = -1;
        for (int l = 0; l < n_layer; l++)
            for (int h = 0; h < n_kv_head; h++) {
                if (dense[l]) continue;
                int i = l * n_kv_head + h;
                if (alloc[i] + step > cap) continue;
                const double *r = mean_recall + (size_t)i * n_budgets;
                double gain = curve_at(budgets, r, n_budgets, alloc[i] + step) - curve_at(budgets, r, n_budgets, alloc[i]);
                if (gain > best_gain) best_gain = gain, best = i;
            }
        if (best < 0) break;
        alloc[best] += step;
        total += step;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        free(alloc);
        free(dense);
        return ellm_fail(err, ELLM_ERR_IO, "profile: cannot write '%s'", path);
    }
    fprintf(f, "ellm-sparse-profile 1\nlayers %d kv_heads %d\n", n_layer, n_kv_head);
    fprintf(f, "# per-head budget multipliers (budget = multiplier x --sparse-topk), calibrated for a mean of %d tokens\n",
            target);
    for (int l = 0; l < n_layer; l++) {
        fprintf(f, "layer %d %s", l, dense[l] ? "dense" : "sparse");
        for (int h = 0; h < n_kv_head; h++)
            fprintf(f, " %.4f", dense[l] ? 1.0 : alloc[l * n_kv_head + h] / target);
        fputc('\n', f);
    }
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    free(alloc);
    free(dense);
    return bad ? ellm_fail(err, ELLM_ERR_IO, "profile: error writing '%s'", path) : ELLM_OK;
}
