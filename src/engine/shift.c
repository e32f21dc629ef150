/* Context shift: when a generation reaches the end of its context, forget a
 * middle part and slide the rest down, as llama.cpp's context shift does.
 *
 * Keys are stored after RoPE, rotated by their position p. Moving a key to
 * p' = p - n_discard needs the rotation by p', and rotations compose:
 * R(p') = R(-n_discard) R(p), so every moved key is rotated once more by
 * -n_discard (the same pairs, normal or NeoX, and the same frequencies,
 * including rope_freqs factors and RoPE scaling, as the forward pass; not
 * YaRN's magnitude, which the stored key has already). Values do not depend on
 * the position and move as they are. The re-rotated key is rounded to the
 * cache's type again, so with an F16 cache it may differ from the key a fresh
 * context would store at p' by about one F16 unit in the last place. The
 * sparse index is rebuilt from the stored keys, so it describes them exactly. */
#include "core/status.h"
#include "engine/engine_impl.h"
#include "kernels/kernels.h"

void engine_rebuild_index(struct ellm_context *ctx, int pos) {
    const model_config *c = &ctx->model->cfg;
    const int hd = c->head_dim, nkv = c->n_head_kv, chunk = ctx->n_batch;
    sparse_index_truncate(ctx->sidx, ctx->kv, 0);
    for (int l = 0; l < c->n_layer; l++)
        for (int p0 = 0; p0 < pos; p0 += chunk) {
            int m = pos - p0 < chunk ? pos - p0 : chunk;
            for (int t = 0; t < m; t++)
                for (int h = 0; h < nkv; h++)
                    kv_cache_key(ctx->kv, l, h, p0 + t, ctx->s.k + ((size_t)t * nkv + h) * hd);
            sparse_index_append(ctx->sidx, l, p0, m, ctx->s.k);
        }
}

ellm_status ellm_context_shift(ellm_context *ctx, int n_keep, int n_discard, ellm_error *err) {
    const int pos = kv_cache_len(ctx->kv);
    if (n_keep < 0 || n_discard < 1 || n_keep > pos || n_discard > pos - n_keep)
        return ellm_fail(err, ELLM_ERR_ARG, "context shift: cannot keep %d and discard %d of %d tokens", n_keep,
                         n_discard, pos);
    if (ctx->dist)
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "context shift: not supported with the KV cache sharded over MPI ranks (positions would "
                         "move between ranks)");
    const ellm_model *m = ctx->model;
    const model_config *c = &m->cfg;
    const int hd = c->head_dim, nkv = c->n_head_kv, chunk = ctx->n_batch;
    float *cs = ctx->s.rope_cs; /* the rotation by -n_discard: n_rot / 2 (cos, sin) pairs */
    model_rope_rotation(m, -n_discard, cs);
    /* Sources lie above their destinations and chunks go upwards, so a chunk
     * is read whole before anything it will read later is overwritten. */
    for (int l = 0; l < c->n_layer; l++)
        for (int p0 = n_keep + n_discard; p0 < pos; p0 += chunk) {
            int n = pos - p0 < chunk ? pos - p0 : chunk;
            for (int t = 0; t < n; t++) {
                float *k = ctx->s.k + (size_t)t * nkv * hd, *v = ctx->s.v + (size_t)t * nkv * hd;
                for (int h = 0; h < nkv; h++) {
                    kv_cache_key(ctx->kv, l, h, p0 + t, k + (size_t)h * hd);
                    kv_cache_value(ctx->kv, l, h, p0 + t, v + (size_t)h * hd);
                }
                kern_rope(k, nkv, hd, c->n_rot, cs, c->rope_neox);
            }
            kv_cache_store(ctx->kv, l, p0 - n_discard, n, ctx->s.k, ctx->s.v);
        }
    kv_cache_set_len(ctx->kv, pos - n_discard);
    if (ctx->sidx) engine_rebuild_index(ctx, pos - n_discard);
    return ELLM_OK;
}
