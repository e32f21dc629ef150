/* Fitting, writing and reading draft maps for shallow:k drafters (see
 * draft_map.h and ellm_draft_calib_* in include/ellm.h). */
#include "spec/draft_map.h"
#include "core/linalg.h"
#include "core/status.h"
#include "engine/engine_impl.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ellm_draft_calib {
    int d, n_layer;
    int n_maps;
    int *layers;     /* (n_maps) k of each map: layers kept, 1 .. n_layer - 1 */
    double *A;       /* (n_maps, d, d) sum of h_k h_k^T (upper triangle filled while collecting) */
    double *B;       /* (n_maps, d, d) sum of h_k h_L^T */
    float *hk;       /* (n_maps, rows, d) the pass's streams after k layers */
    int rows;        /* rows hk holds per map (the context's batch) */
    int64_t tokens;
    int normalize;   /* fit on streams scaled to unit RMS */
};

ellm_status ellm_draft_calib_init(const ellm_model *m, const int *layers, int n_layers, int normalize,
                                  ellm_draft_calib **out, ellm_error *err) {
    *out = NULL;
    const int L = m->cfg.n_layer, d = m->cfg.n_embd;
    if (n_layers < 1 || !layers) return ellm_fail(err, ELLM_ERR_ARG, "draft calibration: no layer count given");
    for (int i = 0; i < n_layers; i++) {
        if (layers[i] < 1 || layers[i] >= L)
            return ellm_fail(err, ELLM_ERR_ARG, "draft calibration: %d layers outside [1, %d) of this model", layers[i], L);
        for (int j = 0; j < i; j++)
            if (layers[j] == layers[i])
                return ellm_fail(err, ELLM_ERR_ARG, "draft calibration: %d layers listed twice", layers[i]);
    }
    ellm_draft_calib *c = calloc(1, sizeof *c);
    if (!c) return ellm_fail(err, ELLM_ERR_NOMEM, "draft calibration: out of memory");
    c->d = d;
    c->n_layer = L;
    c->n_maps = n_layers;
    c->normalize = normalize;
    c->layers = malloc((size_t)n_layers * sizeof *c->layers);
    c->A = calloc((size_t)n_layers * d * d, sizeof *c->A);
    c->B = calloc((size_t)n_layers * d * d, sizeof *c->B);
    if (!c->layers || !c->A || !c->B) {
        ellm_draft_calib_free(c);
        return ellm_fail(err, ELLM_ERR_NOMEM, "draft calibration: out of memory for %d maps of %d x %d", n_layers, d, d);
    }
    memcpy(c->layers, layers, (size_t)n_layers * sizeof *layers);
    *out = c;
    return ELLM_OK;
}

void ellm_draft_calib_free(ellm_draft_calib *c) {
    if (!c) return;
    free(c->layers);
    free(c->A);
    free(c->B);
    free(c->hk);
    free(c);
}

/* The forward pass's per-layer hook: keeps the streams after k layers and,
 * after the last layer, adds the pass's rows to the sums. */
static void calib_hook(void *arg, int layer, const float *x, int n) {
    ellm_draft_calib *c = arg;
    const int d = c->d;
    for (int i = 0; i < c->n_maps; i++)
        if (layer == c->layers[i] - 1) memcpy(c->hk + (size_t)i * c->rows * d, x, (size_t)n * d * sizeof *x);
    if (layer != c->n_layer - 1) return;
    for (int i = 0; i < c->n_maps; i++) {
        double *A = c->A + (size_t)i * d * d, *B = c->B + (size_t)i * d * d;
        const float *H = c->hk + (size_t)i * c->rows * d;
        for (int t = 0; t < n; t++) {
            const float *h = H + (size_t)t * d, *y = x + (size_t)t * d;
            double sh = 1, sy = 1; /* scales: 1, or to unit RMS */
            if (c->normalize) {
                double qh = 0, qy = 0;
                for (int a = 0; a < d; a++) qh += (double)h[a] * h[a], qy += (double)y[a] * y[a];
                sh = qh > 0 ? 1 / sqrt(qh / d) : 0;
                sy = qy > 0 ? 1 / sqrt(qy / d) : 0;
            }
            for (int a = 0; a < d; a++) {
                const double ha = h[a] * sh;
                double *Ar = A + (size_t)a * d, *Br = B + (size_t)a * d;
                for (int b = a; b < d; b++) Ar[b] += ha * h[b] * sh;
                for (int b = 0; b < d; b++) Br[b] += ha * y[b] * sy;
            }
        }
    }
    c->tokens += n;
}

ellm_status ellm_draft_calib_collect(ellm_context *ctx, ellm_draft_calib *c, const int32_t *tokens, int n,
                                     ellm_error *err) {
    if (ctx->model->cfg.n_embd != c->d || ctx->model->cfg.n_layer != c->n_layer)
        return ellm_fail(err, ELLM_ERR_ARG, "draft calibration: the context's model is not the calibration's");
    if (n < 1 || n > ctx->n_ctx)
        return ellm_fail(err, ELLM_ERR_ARG, "draft calibration: %d tokens for a context of %d", n, ctx->n_ctx);
    if (c->rows < ctx->n_batch) {
        float *h = realloc(c->hk, (size_t)c->n_maps * ctx->n_batch * c->d * sizeof *h);
        if (!h) return ellm_fail(err, ELLM_ERR_NOMEM, "draft calibration: out of memory");
        c->hk = h;
        c->rows = ctx->n_batch;
    }
    ellm_context_truncate(ctx, 0);
    ctx->layer_hook = calib_hook;
    ctx->layer_hook_arg = c;
    ellm_status st = ellm_decode(ctx, tokens, n, NULL, err);
    ctx->layer_hook = NULL;
    ctx->layer_hook_arg = NULL;
    return st;
}

int draft_map_solve(double *A, double *B, int n, double lambda) {
    if (linalg_cholesky(A, n, lambda)) return -1;
    linalg_cholesky_solve(A, B, n, n);
    return 0;
}

ellm_status ellm_draft_calib_write(ellm_draft_calib *c, const char *path, ellm_error *err) {
    const int d = c->d;
    if (c->tokens < d)
        return ellm_fail(err, ELLM_ERR_ARG, "draft calibration: %lld tokens seen, fewer than the %d the fit needs",
                         (long long)c->tokens, d);
    float *W = malloc((size_t)c->n_maps * d * d * sizeof *W);
    gguf_writer *w = NULL;
    if (!W) return ellm_fail(err, ELLM_ERR_NOMEM, "draft calibration: out of memory");
    ellm_status st = gguf_writer_init(&w, err);
    if (st == ELLM_OK) st = gguf_writer_add_str(w, "general.architecture", "ellm-draft-map", err);
    if (st == ELLM_OK) st = gguf_writer_add_u32(w, "ellm.draft_map.n_embd", (uint32_t)d, err);
    if (st == ELLM_OK) st = gguf_writer_add_u32(w, "ellm.draft_map.n_layer", (uint32_t)c->n_layer, err);
    if (st == ELLM_OK) st = gguf_writer_add_u64(w, "ellm.draft_map.tokens", (uint64_t)c->tokens, err);
    if (st == ELLM_OK) st = gguf_writer_add_u32(w, "ellm.draft_map.normalized", (uint32_t)c->normalize, err);
    for (int i = 0; i < c->n_maps && st == ELLM_OK; i++) {
        double *A = c->A + (size_t)i * d * d, *B = c->B + (size_t)i * d * d, tr = 0;
        for (int a = 0; a < d; a++) /* mirror the upper triangle */
            for (int b = a + 1; b < d; b++) A[(size_t)b * d + a] = A[(size_t)a * d + b];
        for (int a = 0; a < d; a++) tr += A[(size_t)a * d + a];
        if (draft_map_solve(A, B, d, 1e-4 * tr / d + 1e-9)) {
            st = ellm_fail(err, ELLM_ERR_ARG, "draft calibration: the fit for %d layers is singular", c->layers[i]);
            break;
        }
        /* W = X^T: row o of W weighs the inputs of output channel o */
        float *Wi = W + (size_t)i * d * d;
        for (int o = 0; o < d; o++)
            for (int a = 0; a < d; a++) Wi[(size_t)o * d + a] = (float)B[(size_t)a * d + o];
        char name[64];
        snprintf(name, sizeof name, "draft_map.%d", c->layers[i]);
        int64_t ne[2] = {d, d};
        st = gguf_writer_add_tensor(w, name, 2, ne, QTYPE_F32, Wi, err);
    }
    if (st == ELLM_OK) st = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    free(W);
    /* the sums were overwritten by the solve: nothing more can be collected */
    c->tokens = 0;
    memset(c->A, 0, (size_t)c->n_maps * d * d * sizeof *c->A);
    memset(c->B, 0, (size_t)c->n_maps * d * d * sizeof *c->B);
    return st;
}

ellm_status draft_map_load(const char *path, int d, int n_layer, int k, float **out, int *normalized,
                           ellm_error *err) {
    *out = NULL;
    *normalized = 0;
    gguf_file *f = NULL;
    ellm_status st = gguf_open(path, &f, err);
    if (st != ELLM_OK) return st;
    int64_t fd = 0, fl = 0;
    char name[64];
    snprintf(name, sizeof name, "draft_map.%d", k);
    const gguf_tensor *t = NULL;
    if (gguf_get_i64(f, "ellm.draft_map.n_embd", &fd, err) != ELLM_OK ||
        gguf_get_i64(f, "ellm.draft_map.n_layer", &fl, err) != ELLM_OK) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "draft map %s: not a draft map (no ellm.draft_map.* keys)", path);
    } else if (fd != d || fl != n_layer) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "draft map %s: made for a model of %lld layers of width %lld, not %d of %d",
                       path, (long long)fl, (long long)fd, n_layer, d);
    } else if (!(t = gguf_find_tensor(f, name))) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "draft map %s: no map for %d layers (make one with ellm calibrate "
                       "--draft --draft-layers %d)", path, k, k);
    } else if (t->type != QTYPE_F32 || t->n_dims != 2 || t->ne[0] != d || t->ne[1] != d ||
               t->n_bytes != (size_t)d * d * sizeof(float)) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "draft map %s: %s is not an F32 %d x %d matrix", path, name, d, d);
    } else {
        float *w = malloc(t->n_bytes);
        if (!w) {
            st = ellm_fail(err, ELLM_ERR_NOMEM, "draft map %s: out of memory", path);
        } else {
            memcpy(w, t->data, t->n_bytes);
            for (size_t i = 0; i < (size_t)d * d && st == ELLM_OK; i++)
                if (!isfinite(w[i])) st = ellm_fail(err, ELLM_ERR_FORMAT, "draft map %s: %s holds a non-finite value", path, name);
            int64_t norm = 0;
            if (st == ELLM_OK && gguf_find_key(f, "ellm.draft_map.normalized") >= 0 &&
                gguf_get_i64(f, "ellm.draft_map.normalized", &norm, err) != ELLM_OK)
                st = ellm_fail(err, ELLM_ERR_FORMAT, "draft map %s: ellm.draft_map.normalized is not an integer", path);
            if (st == ELLM_OK) *out = w, *normalized = norm != 0;
            else free(w);
        }
    }
    gguf_close(f);
    return st;
}
