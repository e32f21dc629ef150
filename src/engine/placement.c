/* The context's side of NUMA placement: threads pinned per the model's plan,
 * per-thread weight copies (replicate) and, with interleave, the KV pool spread over the nodes.
 *
 * Attention cuts the (KV head, block) units of a layer into contiguous
 * per-thread ranges with heads outermost, and plan threads are numbered node
 * by node. */
#include "engine/engine_impl.h"
#include "core/status.h"
#include "kernels/quant.h"
#include "topology/place.h"

#include <stdlib.h>

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
    /* KV pages come from a pool as the sequence grows, so they cannot be
     * placed per head up front: interleave spreads the pool's whole reserved
     * range over the nodes; otherwise a page lands on the node of the thread
     * that first writes it. */
    if (pl->mode == TOPO_NUMA_INTERLEAVE) {
        size_t bytes;
        void *base = kv_pool_base(kv_cache_pool(ctx->kv), &bytes);
        place_interleave(base, bytes, pl->node_os, pl->n_nodes, PLACE_MOVE);
    }
    return ELLM_OK;
}
