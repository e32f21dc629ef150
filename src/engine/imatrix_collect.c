/* Importance-matrix collection: runs the model over sample text with the
 * context's imatrix hook set, so forward passes add their matmul inputs to
 * the sums (imatrix.c holds them). Kept apart from imatrix.c so that the
 * forward pass, which feeds the sums, does not depend on the driver that
 * calls it. */
#include "core/status.h"
#include "engine/engine_impl.h"

ellm_status ellm_imatrix_collect(ellm_context *ctx, ellm_imatrix *im, const int32_t *tokens, int n, ellm_error *err) {
    if (!ctx || !im || n <= 0) return ellm_fail(err, ELLM_ERR_ARG, "imatrix: bad arguments");
    ellm_context_truncate(ctx, 0);
    ctx->imatrix = im;
    ellm_status st = ELLM_OK;
    int64_t calls = 0;
    for (int i = 0; i < n && st == ELLM_OK; i += ctx->n_batch) {
        int k = n - i < ctx->n_batch ? n - i : ctx->n_batch;
        st = ellm_decode(ctx, tokens + i, k, NULL, err);
        calls++;
    }
    ctx->imatrix = NULL;
    engine_imatrix_count(im, calls, st == ELLM_OK ? n : 0);
    return st;
}
