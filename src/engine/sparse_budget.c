/* Per-head sparse attention budgets: the budget of each (layer, KV head), the
 * recall its chosen blocks hold (sampled during decode, probed at other
 * budgets), the --sparse-adapt re-balancing that follows those samples, and
 * the samples ellm_sparse_calibrate collects. Called by the forward pass;
 * calls only into attention/. */
#include "engine/engine_impl.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

/* The least budget a head gets: what the sink and the window take, plus one block. */
static int budget_floor(const struct ellm_context *ctx) {
    const ellm_context_params *p = &ctx->params;
    return (p->sparse_sink_blocks + 1) * kv_cache_get_params(ctx->kv)->block_tokens + p->sparse_window;
}

int engine_sparse_budget(const struct ellm_context *ctx, int layer, int head) {
    const float w = ctx->head_weight[layer * ctx->model->cfg.n_head_kv + head];
    /* a budget past the int range (a huge sparse_topk) is all of any context */
    const float fb = (float)ctx->sparse_topk * w + 0.5f;
    const int b = fb < (float)INT_MAX ? (int)fb : INT_MAX;
    const int floor_b = budget_floor(ctx);
    return b > floor_b ? b : floor_b;
}

int ellm_context_sparse_dense_len(const ellm_context *ctx) {
    if (!ctx->sidx || ctx->sparse_topk <= 0) return INT_MAX;
    const model_config *c = &ctx->model->cfg;
    /* adapting budgets move between heads: any head may fall to the floor */
    if (ctx->params.sparse_adapt) return budget_floor(ctx);
    int len = INT_MAX;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv && !ctx->layer_dense[l]; h++) {
            const int b = engine_sparse_budget(ctx, l, h);
            if (b < len) len = b;
        }
    return len;
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

/* Scratch of the recall samples, made at the first one (a context that
 * never samples never pays for it): the attention parts of one decode row at
 * the context's full length, the log-sum-exp of every query head over all
 * keys, over the chosen blocks and over a probe's, and the probe's block
 * lists. 0 if out of memory (the sample is then skipped). */
static int recall_scratch(struct ellm_context *ctx) {
    if (ctx->lse_parts) return 1;
    const model_config *c = &ctx->model->cfg;
    const long n_parts = (kv_cache_n_blocks(ctx->kv) + ATTENTION_PART_BLOCKS - 1) / ATTENTION_PART_BLOCKS;
    const size_t rec = (size_t)c->n_head * (size_t)(c->head_dim + 2);
    float *mem = malloc(((size_t)n_parts * rec + 3 * (size_t)c->n_head) * sizeof *mem);
    float **parts = malloc((size_t)n_parts * sizeof *parts);
    int32_t *probe = malloc((size_t)c->n_head_kv * ctx->max_blocks * sizeof *probe);
    int *probe_n = malloc((size_t)c->n_head_kv * sizeof *probe_n);
    if (!mem || !parts || !probe || !probe_n) {
        free(mem);
        free(parts);
        free(probe);
        free(probe_n);
        return 0;
    }
    ctx->probe_blocks = probe;
    ctx->probe_n = probe_n;
    for (long i = 0; i < n_parts; i++) parts[i] = mem + (size_t)i * rec;
    ctx->lse_mem = mem;
    ctx->lse_parts = parts;
    ctx->lse_all = mem + (size_t)n_parts * rec;
    ctx->lse_set = ctx->lse_all + c->n_head;
    ctx->lse_probe = ctx->lse_set + c->n_head;
    return 1;
}

/* Log-sum-exp of each query head's scores (the decode row in ctx->s.q) over
 * the keys of `layer` that the lists hold (blocks NULL: all len keys). */
static void layer_lse(struct ellm_context *ctx, int layer, int len, const int32_t *blocks, const int *n_blocks,
                      float *lse) {
    const model_config *c = &ctx->model->cfg;
    attention_args aa = {.kv = ctx->kv,
                         .layer = layer,
                         .n_q = 1,
                         .q_pos0 = len - 1,
                         .n_head = c->n_head,
                         .q = ctx->s.q,
                         .out = NULL,
                         .scale = 1.0f / sqrtf((float)c->head_dim)};
    attention_lse(&aa, blocks, n_blocks, ctx->max_blocks, ctx->lse_parts, lse, ctx->attn_ws, ctx->pool);
}

/* Recall of KV head h's block set: the mean over its query heads of the
 * attention mass the set holds, exp(lse over the set - lse over all keys). */
static float head_recall(const struct ellm_context *ctx, int h, const float *lse_set) {
    const int group = ctx->model->cfg.n_head / ctx->model->cfg.n_head_kv;
    double sum = 0.0;
    for (int g = 0; g < group; g++) {
        const int i = h * group + g;
        sum += ctx->lse_all[i] > -INFINITY ? exp((double)lse_set[i] - (double)ctx->lse_all[i]) : 0.0;
    }
    return (float)(sum / group);
}

/* Chooses, for every KV head h of `layer`, the blocks that a budget of
 * fixed_budget tokens (0: h's own budget + budget_add) would take into
 * ctx->probe_blocks (lists of ctx->max_blocks), and leaves their
 * log-sum-exp in ctx->lse_probe. */
static void probe_lse(struct ellm_context *ctx, int layer, int len, int budget_add, int fixed_budget) {
    const model_config *c = &ctx->model->cfg;
    int *n = ctx->probe_n;
    for (int h = 0; h < c->n_head_kv; h++) {
        const int budget = fixed_budget > 0 ? fixed_budget : engine_sparse_budget(ctx, layer, h) + budget_add;
        sparse_index_select(ctx->sidx, layer, h, ctx->s.q, 1, c->n_head / c->n_head_kv, len, budget,
                            ctx->params.sparse_sink_blocks, ctx->params.sparse_window,
                            ctx->probe_blocks + (size_t)h * ctx->max_blocks, &n[h], NULL);
    }
    layer_lse(ctx, layer, len, ctx->probe_blocks, n, ctx->lse_probe);
}

/* Recall of the blocks just chosen for `layer`: the true attention mass they
 * hold (sampled every sparse_recall_every decode steps). One attention pass
 * over every key of the layer, on the pool, and one over the chosen blocks. */
void engine_sparse_sample_recall(struct ellm_context *ctx, int layer, int len) {
    const model_config *c = &ctx->model->cfg;
    if (!recall_scratch(ctx)) return;
    layer_lse(ctx, layer, len, NULL, NULL, ctx->lse_all);
    layer_lse(ctx, layer, len, ctx->sel_blocks, ctx->sel_n, ctx->lse_set);
    for (int h = 0; h < c->n_head_kv; h++) {
        const float r = head_recall(ctx, h, ctx->lse_set);
        ellm_context_stats *st = &ctx->stats;
        st->sparse_recall = (st->sparse_recall * (double)st->recall_samples + r) / (double)(st->recall_samples + 1);
        st->recall_samples++;
        float *ema = &ctx->recall_ema[layer * c->n_head_kv + h];
        *ema = *ema < 0 ? r : 0.9f * *ema + 0.1f * r;
    }
    if (!ctx->params.sparse_adapt) return;
    /* Probe: the recall 64 more tokens would buy each head (none where the
     * larger budget covers the context). */
    probe_lse(ctx, layer, len, 64, 0);
    for (int h = 0; h < c->n_head_kv; h++) {
        if (engine_sparse_budget(ctx, layer, h) + 64 >= len) continue;
        const float r = head_recall(ctx, h, ctx->lse_set), r2 = head_recall(ctx, h, ctx->lse_probe);
        const float g = r2 > r ? r2 - r : 0.0f;
        float *gema = &ctx->gain_ema[layer * c->n_head_kv + h];
        *gema = *gema < 0 ? g : 0.9f * *gema + 0.1f * g;
    }
}

void engine_calibrate_layer(struct ellm_context *ctx, int layer, int len) {
    const model_config *c = &ctx->model->cfg;
    if (!recall_scratch(ctx)) return;
    layer_lse(ctx, layer, len, NULL, NULL, ctx->lse_all);
    for (int b = 0; b < ctx->calib->n_budgets; b++) {
        const int budget = ctx->calib->budgets[b];
        if (budget < len) probe_lse(ctx, layer, len, 0, budget);
        for (int h = 0; h < c->n_head_kv; h++) {
            double *sum = ctx->calib->sum + ((size_t)layer * c->n_head_kv + h) * ctx->calib->n_budgets;
            sum[b] += budget >= len ? 1.0 : head_recall(ctx, h, ctx->lse_probe);
        }
    }
    if (layer == c->n_layer - 1) (*ctx->calib->n_samples)++;
}
