/* Per-head sparse attention budgets: the budget of each (layer, KV head), the
 * recall its chosen blocks hold (sampled during decode, probed at other
 * budgets), the --sparse-adapt re-balancing that follows those samples, and
 * the samples ellm_sparse_calibrate collects. Called by the forward pass;
 * calls only into attention/. */
#include "engine/engine_impl.h"

#include <math.h>

int engine_sparse_budget(const struct ellm_context *ctx, int layer, int head) {
    const ellm_context_params *p = &ctx->params;
    float w = ctx->head_weight[layer * ctx->model->cfg.n_head_kv + head];
    int b = (int)(ctx->sparse_topk * w + 0.5f);
    /* never below what the sink and the window take, plus one block */
    int floor_b = (p->sparse_sink_blocks + 1) * kv_cache_get_params(ctx->kv)->block_tokens + p->sparse_window;
    return b > floor_b ? b : floor_b;
}

/* Moves budget towards the heads where it buys the most: each sample measures,
 * per head, the recall gained by 64 more tokens; weights follow
 * w *= exp(eta * (gain - mean) / mean), clamped to [1/2, 2] and renormalized
 * to a mean of 1 over the sparse heads, so the total budget is unchanged. */
void engine_sparse_adapt(struct ellm_context *ctx) {
    const model_config *c = &ctx->model->cfg;
    double sum_g = 0;
    int n = 0;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv && !ctx->layer_dense[l]; h++) {
            float g = ctx->gain_ema[l * c->n_head_kv + h];
            if (g >= 0) {
                sum_g += g;
                n++;
            }
        }
    if (n == 0 || sum_g <= 0) return;
    double mean_g = sum_g / n, sum_w = 0;
    int nw = 0;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv && !ctx->layer_dense[l]; h++) {
            float *w = &ctx->head_weight[l * c->n_head_kv + h];
            float g = ctx->gain_ema[l * c->n_head_kv + h];
            if (g >= 0) *w *= expf((float)(0.25 * (g - mean_g) / mean_g));
            if (*w < 0.5f) *w = 0.5f;
            if (*w > 2.0f) *w = 2.0f;
            sum_w += *w;
            nw++;
        }
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv && !ctx->layer_dense[l]; h++)
            ctx->head_weight[l * c->n_head_kv + h] *= (float)(nw / sum_w);
}

float engine_sparse_probe_recall(struct ellm_context *ctx, int layer, int head, int len, int budget) {
    const model_config *c = &ctx->model->cfg;
    if (budget >= len) return 1.0f;
    int group = c->n_head / c->n_head_kv, nb = 0;
    sparse_index_select(ctx->sidx, layer, head, ctx->s.q, 1, group, len, budget, ctx->params.sparse_sink_blocks,
                        ctx->params.sparse_window, ctx->probe_blocks, &nb, NULL);
    return sparse_index_recall(ctx->kv, layer, head, ctx->s.q, 1, group, len, ctx->probe_blocks, nb,
                               1.0f / sqrtf((float)c->head_dim), NULL);
}

/* Recall of the blocks just chosen for `layer`: the true attention mass they
 * hold, from a dense scan (sampled every sparse_recall_every decode steps). */
void engine_sparse_sample_recall(struct ellm_context *ctx, int layer, int len) {
    const model_config *c = &ctx->model->cfg;
    int group = c->n_head / c->n_head_kv;
    for (int h = 0; h < c->n_head_kv; h++) {
        float r = sparse_index_recall(ctx->kv, layer, h, ctx->s.q, 1, group, len,
                                      ctx->sel_blocks + (size_t)h * ctx->max_blocks, ctx->sel_n[h],
                                      1.0f / sqrtf((float)c->head_dim), NULL);
        ellm_context_stats *st = &ctx->stats;
        st->sparse_recall = (st->sparse_recall * (double)st->recall_samples + r) / (double)(st->recall_samples + 1);
        st->recall_samples++;
        float *ema = &ctx->recall_ema[layer * c->n_head_kv + h];
        *ema = *ema < 0 ? r : 0.9f * *ema + 0.1f * r;
        if (!ctx->params.sparse_adapt) continue;
        /* Probe: the recall 64 more tokens would buy this head. */
        int budget = engine_sparse_budget(ctx, layer, h);
        if (budget + 64 >= len) continue;
        float r2 = engine_sparse_probe_recall(ctx, layer, h, len, budget + 64);
        float g = r2 > r ? r2 - r : 0.0f;
        float *gema = &ctx->gain_ema[layer * c->n_head_kv + h];
        *gema = *gema < 0 ? g : 0.9f * *gema + 0.1f * g;
    }
}

void engine_calibrate_layer(struct ellm_context *ctx, int layer, int len) {
    const model_config *c = &ctx->model->cfg;
    for (int h = 0; h < c->n_head_kv; h++) {
        double *sum = ctx->calib->sum + ((size_t)layer * c->n_head_kv + h) * ctx->calib->n_budgets;
        for (int b = 0; b < ctx->calib->n_budgets; b++)
            sum[b] += engine_sparse_probe_recall(ctx, layer, h, len, ctx->calib->budgets[b]);
    }
    if (layer == c->n_layer - 1) (*ctx->calib->n_samples)++;
}
