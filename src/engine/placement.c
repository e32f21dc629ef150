/* The context's side of NUMA placement: threads pinned per the model's plan,
 * per-thread weight copies (replicate) and KV heads on their readers' node.
 *
 * Attention cuts the (KV head, block) units of a layer into contiguous
 * per-thread ranges with heads outermost, and plan threads are numbered node
 * by node, so each node's threads read a contiguous run of KV heads at every
 * depth: the heads topo_plan_kv_head_node assigns to that node. */
#include "engine/engine_impl.h"
#include "core/status.h"
#include "kernels/quant.h"
#include "topology/place.h"

#include <stdlib.h>

/* [*lo, *hi): the storage of KV head `h` of `layer` (all its blocks). */
static void head_span(const kv_cache *kv, int layer, int h, char **lo, char **hi) {
    const kv_cache_params *p = kv_cache_get_params(kv);
    int nb = kv_cache_n_blocks(kv);
    size_t half = kv_cache_block_bytes(kv) / 2;
    (void)p;
    *lo = (char *)kv_cache_block_k(kv, layer, h, 0);
    *hi = (char *)kv_cache_block_v(kv, layer, h, nb - 1) + half;
}

ellm_status engine_placement_init(struct ellm_context *ctx, int n_threads, ellm_error *err) {
    const ellm_model *m = ctx->model;
    const topo_plan *pl = m->plan;
    if (!pl || n_threads != pl->n_threads) /* no plan, or another thread count asked for */
        return threadpool_init(n_threads, m->pin_threads, &ctx->pool, err);
    ellm_status st = threadpool_init_cpus(pl->n_threads, pl->cpu, &ctx->pool, err);
    if (st) return st;
    if (m->node_delta) {
        ctx->w_delta = calloc((size_t)pl->n_threads, sizeof *ctx->w_delta);
        if (!ctx->w_delta) return ellm_fail(err, ELLM_ERR_NOMEM, "context: out of memory");
        for (int t = 0; t < pl->n_threads; t++) ctx->w_delta[t] = m->node_delta[pl->thread_node[t]];
    }
    ctx->split_by_matrix = m->split_by_matrix;
    if (pl->n_nodes < 2 || !ctx->kv) return ELLM_OK;
    const kv_cache_params *p = kv_cache_get_params(ctx->kv);
    if (pl->mode == TOPO_NUMA_INTERLEAVE) {
        char *lo, *hi, *lo2, *hi2;
        head_span(ctx->kv, 0, 0, &lo, &hi);
        head_span(ctx->kv, p->n_layer - 1, p->n_kv_head - 1, &lo2, &hi2);
        place_interleave(lo, (size_t)(hi2 - lo), pl->node_os, pl->n_nodes, PLACE_MOVE);
        return ELLM_OK;
    }
    for (int l = 0; l < p->n_layer; l++)
        for (int h = 0; h < p->n_kv_head; h++) {
            char *lo, *hi;
            head_span(ctx->kv, l, h, &lo, &hi);
            place_on_node(lo, (size_t)(hi - lo), pl->node_os[topo_plan_kv_head_node(pl, p->n_kv_head, h)], PLACE_MOVE);
        }
    return ELLM_OK;
}
