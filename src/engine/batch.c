/* Continuous batching: one forward pass over the rows of several contexts.
 *
 * The batch owns the thread pool its contexts share (so threads are never
 * oversubscribed by idle pools of other sequences) and scratch for max_rows
 * stacked rows; engine_forward_seqs does the pass. */
#include "core/status.h"
#include "engine/engine_impl.h"

#include <stdlib.h>
#include <string.h>

struct ellm_batch {
    ellm_model *model;
    threadpool *pool;
    ptrdiff_t *w_delta; /* (threads) offsets to per-node weight copies, or NULL */
    int max_rows;
    engine_scratch s;
    float *logits; /* (max_rows x n_vocab) logit rows of a pass */
};

static void *xalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) return NULL;
    return p;
}

ellm_status ellm_batch_init(ellm_model *model, int n_threads, int max_rows, ellm_batch **out, ellm_error *err) {
    *out = NULL;
    if (!model) return ellm_fail(err, ELLM_ERR_ARG, "batch: no model");
    if (max_rows < 1 || max_rows > 65536)
        return ellm_fail(err, ELLM_ERR_ARG, "batch: %d rows per pass is out of range [1, 65536]", max_rows);
    const model_config *c = &model->cfg;
    ellm_batch *b = calloc(1, sizeof *b);
    if (!b) return ellm_fail(err, ELLM_ERR_NOMEM, "batch: out of memory");
    b->model = model;
    b->max_rows = max_rows;
    /* Threads (and NUMA weight copies) placed as a context of the model's
     * would be: a context without a KV cache of its own lends its setup. */
    struct ellm_context place = {.model = model};
    ellm_status st = engine_placement_init(&place, n_threads > 0 ? n_threads : model->n_threads, err);
    if (st) {
        free(place.w_delta);
        free(b);
        return st;
    }
    b->pool = place.pool;
    b->w_delta = place.w_delta;
    b->logits = xalloc((size_t)max_rows * (size_t)c->n_vocab * 4);
    if (engine_scratch_init(model, max_rows, &b->s) || !b->logits) {
        ellm_batch_free(b);
        return ellm_fail(err, ELLM_ERR_NOMEM, "batch: out of memory for %d rows of scratch", max_rows);
    }
    b->s.w_delta = b->w_delta;
    b->s.by_matrix = place.split_by_matrix;
    *out = b;
    return ELLM_OK;
}

void ellm_batch_free(ellm_batch *b) {
    if (!b) return;
    threadpool_free(b->pool);
    free(b->w_delta);
    engine_scratch_free(&b->s);
    free(b->logits);
    free(b);
}

ellm_status ellm_batch_context_init(ellm_batch *batch, const ellm_context_params *params, ellm_context **out,
                                    ellm_error *err) {
    *out = NULL;
    if (!batch) return ellm_fail(err, ELLM_ERR_ARG, "batch context: no batch");
    return engine_context_init(batch->model, params, batch->pool, out, err);
}

ellm_status ellm_decode_batch(ellm_batch *b, ellm_context *const *ctxs, const int32_t *const *tokens,
                              const int *n_tokens, int n_seq, ellm_error *err) {
    return ellm_decode_batch_rows(b, ctxs, tokens, n_tokens, n_seq, NULL, err);
}

ellm_status ellm_decode_batch_rows(ellm_batch *b, ellm_context *const *ctxs, const int32_t *const *tokens,
                                   const int *n_tokens, int n_seq, float *const *row_logits, ellm_error *err) {
    if (n_seq < 1 || n_seq > b->max_rows)
        return ellm_fail(err, ELLM_ERR_ARG, "decode batch: %d sequences (1 to %d)", n_seq, b->max_rows);
    const int n_vocab = b->model->cfg.n_vocab;
    long rows = 0;
    for (int i = 0; i < n_seq; i++) {
        ellm_context *ctx = ctxs[i];
        if (!ctx || ctx->model != b->model || ctx->pool != b->pool)
            return ellm_fail(err, ELLM_ERR_ARG, "decode batch: sequence %d is not a context of this batch", i);
        for (int j = 0; j < i; j++)
            if (ctxs[j] == ctx) return ellm_fail(err, ELLM_ERR_ARG, "decode batch: context of sequence %d is listed twice", i);
        int n = n_tokens[i], pos = kv_cache_len(ctx->kv);
        if (n < 1 || n > ctx->n_batch)
            return ellm_fail(err, ELLM_ERR_ARG, "decode batch: sequence %d feeds %d tokens (1 to its n_batch %d)", i, n,
                             ctx->n_batch);
        if (n > ctx->n_ctx - pos)
            return ellm_fail(err, ELLM_ERR_CONTEXT_FULL,
                             "decode batch: sequence %d: %d tokens at position %d exceed the context size %d", i, n, pos,
                             ctx->n_ctx);
        for (int t = 0; t < n; t++)
            if (tokens[i][t] < 0 || tokens[i][t] >= n_vocab)
                return ellm_fail(err, ELLM_ERR_ARG,
                                 "decode batch: sequence %d: token id %d at index %d is outside the vocabulary [0, %d)", i,
                                 tokens[i][t], t, n_vocab);
        rows += n;
    }
    for (int i = 0; i < n_seq; i++) { /* KV pages for the new rows (a failure leaves every cache as it was) */
        ellm_status st = kv_cache_reserve(ctxs[i]->kv, kv_cache_len(ctxs[i]->kv) + n_tokens[i], err);
        if (st) return st;
    }
    if (rows > b->max_rows)
        return ellm_fail(err, ELLM_ERR_ARG, "decode batch: %ld rows exceed the batch's %d", rows, b->max_rows);
    engine_seq seqs[n_seq];
    for (int i = 0; i < n_seq; i++) {
        const int all = row_logits && row_logits[i];
        seqs[i] = (engine_seq){.ctx = ctxs[i],
                               .tokens = tokens[i],
                               .n = n_tokens[i],
                               .pos = kv_cache_len(ctxs[i]->kv),
                               .first_logit_row = all ? 0 : n_tokens[i] - 1,
                               .logits = all ? row_logits[i] : ctxs[i]->logits};
    }
    engine_forward_seqs(b->model, &b->s, b->pool, b->logits, seqs, n_seq);
    /* KV sharded over MPI ranks: a failed exchange left zeros for attention */
    for (int i = 0; i < n_seq; i++)
        if (ctxs[i]->dist && dist_failed(ctxs[i]->dist)) {
            for (int k = 0; k < n_seq; k++) ctxs[k]->has_logits = 0;
            return ellm_fail(err, ELLM_ERR_IO, "decode batch: %s", dist_failed(ctxs[i]->dist));
        }
    for (int i = 0; i < n_seq; i++) ctxs[i]->has_logits = 1;
    return ELLM_OK;
}
