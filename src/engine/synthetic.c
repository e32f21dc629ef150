/* Synthetic KV contents and the bandwidth self-test, for `ellm bench`. */
#include "core/membw.h"
#include "core/status.h"
#include "engine/engine_impl.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdlib.h>

static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Approximately N(0, 1): sum of four uniforms, rescaled (cheap; shape only matters). */
static float approx_normal(uint64_t *s) {
    uint64_t r = next_u64(s);
    float a = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) +
              (float)(r >> 48);
    return (a / 65535.0f - 2.0f) * 1.7320508f;
}

ellm_status ellm_context_fill_synthetic(ellm_context *ctx, int n, uint64_t seed, ellm_error *err) {
    const model_config *c = &ctx->model->cfg;
    if (n < 0 || n > ctx->n_ctx)
        return ellm_fail(err, ELLM_ERR_CONTEXT_FULL, "synthetic KV: %d tokens exceed the context size %d", n,
                         ctx->n_ctx);
    const int hd = c->head_dim, nkv = c->n_head_kv * hd, chunk = ctx->n_batch;
    float *mu = malloc((size_t)nkv * sizeof *mu);
    if (!mu) return ellm_fail(err, ELLM_ERR_NOMEM, "synthetic KV: out of memory");
    ellm_status st = kv_cache_reserve(ctx->kv, n, err);
    if (st) {
        free(mu);
        return st;
    }
    uint64_t s = seed;
    if (ctx->sidx) sparse_index_truncate(ctx->sidx, ctx->kv, 0);
    for (int l = 0; l < c->n_layer; l++) {
        /* Per-channel key offsets: a few channels dominate, as in trained models. */
        for (int i = 0; i < nkv; i++) mu[i] = approx_normal(&s) * (i % 16 == 0 ? 4.0f : 1.0f);
        for (int p0 = 0; p0 < n; p0 += chunk) {
            int m = n - p0 < chunk ? n - p0 : chunk;
            for (int t = 0; t < m; t++) {
                float *k = ctx->s.k + (size_t)t * nkv, *v = ctx->s.v + (size_t)t * nkv;
                for (int i = 0; i < nkv; i++) {
                    k[i] = mu[i] + approx_normal(&s);
                    v[i] = approx_normal(&s);
                }
                model_rope_cos_sin(ctx->model, p0 + t, ctx->s.rope_cs);
                kern_rope(k, c->n_head_kv, hd, c->n_rot, ctx->s.rope_cs, c->rope_neox);
            }
            if (ctx->dist) dist_kv_store(ctx->dist, ctx->kv, l, p0, m, ctx->s.k, ctx->s.v); /* own parts only */
            else kv_cache_store(ctx->kv, l, p0, m, ctx->s.k, ctx->s.v);
            if (ctx->sidx) {
                /* a quantized cache stores other keys than computed: summarize those */
                if (kv_cache_get_params(ctx->kv)->type == QTYPE_Q8_0) kv_cache_load_keys(ctx->kv, l, p0, m, ctx->s.k);
                sparse_index_append(ctx->sidx, l, p0, m, ctx->s.k);
            }
        }
    }
    free(mu);
    kv_cache_set_len(ctx->kv, n);
    ctx->has_logits = 0;
    return ELLM_OK;
}

size_t ellm_context_kv_bytes_per_token(const ellm_context *ctx) { return kv_cache_bytes_per_token(ctx->kv); }

double ellm_measure_read_gbps(int n_threads, size_t bytes, int reps) {
    threadpool *pool;
    if (threadpool_init(n_threads, 1, &pool, NULL) != ELLM_OK) return 0;
    double g = membw_read_gbps(pool, bytes, reps);
    threadpool_free(pool);
    return g;
}
