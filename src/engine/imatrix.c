/* Importance matrix (llama.cpp's imatrix): while the model runs over sample
 * text, the mean squared activation that meets each input column of each
 * weight matrix. The converter weights its rounding errors by it (columns
 * that see large activations matter more), and llama-quantize reads the
 * same file format. */
#include "core/status.h"
#include "engine/engine_impl.h"
#include "kernels/kernels.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The matmul inputs of one layer. The Q, K and V matrices share one input,
 * as do gate and up. */

struct ellm_imatrix {
    int n_layer;
    int64_t cols[IM_SLOTS];
    double *sum[IM_SLOTS]; /* (n_layer * cols) sums of x^2 */
    int cov_block;         /* 0, or B: covariances within blocks of B columns */
    double *cov[IM_SLOTS]; /* (n_layer * cols * B): column c's products with
                            * the B columns of its block (past its end: 0) */
    float *xt;             /* one batch's inputs, column by column */
    size_t xt_cap;
    int cov_failed;        /* out of memory for xt: the covariance is incomplete */
    int64_t n_rows;        /* activation rows (tokens) seen per matrix */
    int64_t n_calls;       /* forward passes */
};

ellm_status ellm_imatrix_init(const ellm_model *m, ellm_imatrix **out, ellm_error *err) {
    *out = NULL;
    const model_config *c = &m->cfg;
    ellm_imatrix *im = calloc(1, sizeof *im);
    if (!im) return ellm_fail(err, ELLM_ERR_NOMEM, "imatrix: out of memory");
    im->n_layer = c->n_layer;
    im->cols[IM_ATTN_IN] = c->n_embd;
    im->cols[IM_ATTN_OUT] = (int64_t)c->n_head * c->head_dim;
    im->cols[IM_FFN_IN] = c->n_embd;
    im->cols[IM_FFN_DOWN] = c->n_ff;
    for (int s = 0; s < IM_SLOTS; s++) {
        im->sum[s] = calloc((size_t)(im->n_layer * im->cols[s]), sizeof(double));
        if (!im->sum[s]) {
            ellm_imatrix_free(im);
            return ellm_fail(err, ELLM_ERR_NOMEM, "imatrix: out of memory");
        }
    }
    *out = im;
    return ELLM_OK;
}

void ellm_imatrix_free(ellm_imatrix *im) {
    if (!im) return;
    for (int s = 0; s < IM_SLOTS; s++) {
        free(im->sum[s]);
        free(im->cov[s]);
    }
    free(im->xt);
    free(im);
}

ellm_status ellm_imatrix_set_covariance(ellm_imatrix *im, int block, ellm_error *err) {
    if (!im || im->n_rows > 0 || im->cov_block)
        return ellm_fail(err, ELLM_ERR_ARG, "imatrix: covariance must be enabled once, before collecting");
    if (block < 8 || block > 1024)
        return ellm_fail(err, ELLM_ERR_ARG, "imatrix: covariance block %d outside 8..1024", block);
    for (int s = 0; s < IM_SLOTS; s++) {
        im->cov[s] = calloc((size_t)(im->n_layer * im->cols[s]) * (size_t)block, sizeof(double));
        if (!im->cov[s]) return ellm_fail(err, ELLM_ERR_NOMEM, "imatrix: out of memory for the covariance");
    }
    im->cov_block = block;
    return ELLM_OK;
}

void engine_imatrix_observe(ellm_imatrix *im, int layer, int slot, const float *X, int nb) {
    int64_t cols = im->cols[slot];
    double *s = im->sum[slot] + (size_t)layer * (size_t)cols;
    for (int b = 0; b < nb; b++)
        for (int64_t c = 0; c < cols; c++) s[c] += (double)X[b * cols + c] * X[b * cols + c];
    const int B = im->cov_block;
    if (!B || nb <= 0) return;
    /* columns of X contiguous, so each product is one dot over the batch's
     * rows and the covariance is walked once per batch, not once per row */
    const size_t need = (size_t)cols * (size_t)nb;
    if (need > im->xt_cap) {
        free(im->xt);
        im->xt = malloc(need * sizeof *im->xt);
        im->xt_cap = im->xt ? need : 0;
        if (!im->xt) {
            im->cov_failed = 1;
            return;
        }
    }
    for (int b = 0; b < nb; b++)
        for (int64_t c = 0; c < cols; c++) im->xt[(size_t)c * nb + b] = X[(size_t)b * cols + c];
    double *cv = im->cov[slot] + (size_t)layer * (size_t)cols * (size_t)B;
    for (int64_t c = 0; c < cols; c++) {
        const int64_t c0 = c / B * B, n = cols - c0 < B ? cols - c0 : B;
        const float *xc = im->xt + (size_t)c * nb;
        double *row = cv + (size_t)c * (size_t)B;
        for (int64_t k = c - c0; k < n; k++) row[k] += kern_dot_f32(xc, im->xt + (size_t)(c0 + k) * nb, nb);
    }
}

void engine_imatrix_count(ellm_imatrix *im, int64_t calls, int64_t rows) {
    im->n_calls += calls;
    im->n_rows += rows;
}

/* The covariance entry of one input, "<name>.cov" under the first matrix
 * that reads it (attn_q for attn_k and attn_v too, ffn_gate for ffn_up):
 * nval = cols * B values,
 * row c the mean products of column c with the B columns of its block (the
 * block starting at c / B * B; past the matrix's last column: 0), both
 * triangles filled, times ncall as the main entry's values. */
static int write_cov(FILE *f, const ellm_imatrix *im, int l, int s, const char *name, int32_t ncall, float *vals) {
    const int B = im->cov_block;
    const int64_t cols = im->cols[s];
    const double *cv = im->cov[s] + (size_t)l * (size_t)cols * (size_t)B;
    const double k = (double)ncall / (double)im->n_rows;
    for (int64_t c = 0; c < cols; c++) {
        const int64_t c0 = c / B * B;
        for (int64_t j = 0; j < B; j++) {
            const int64_t cj = c0 + j;
            double v = 0;
            if (cj < cols) v = cj >= c ? cv[(size_t)c * B + (size_t)j] : cv[(size_t)cj * B + (size_t)(c - c0)];
            vals[(size_t)c * B + (size_t)j] = (float)(v * k);
        }
    }
    char cname[128];
    int32_t len = snprintf(cname, sizeof cname, "%s.cov", name), nval = (int32_t)(cols * B);
    return fwrite(&len, 4, 1, f) == 1 && fwrite(cname, 1, (size_t)len, f) == (size_t)len &&
           fwrite(&ncall, 4, 1, f) == 1 && fwrite(&nval, 4, 1, f) == 1 &&
           fwrite(vals, 4, (size_t)nval, f) == (size_t)nval;
}

/* llama.cpp's imatrix .dat layout (little-endian): i32 n_entries, then per
 * entry i32 name length, the name, i32 ncall, i32 nval and nval float32
 * values = mean(x^2) * ncall; then i32 last chunk, i32 dataset name length
 * and the dataset name. */
ellm_status ellm_imatrix_write(const ellm_imatrix *im, const char *path, const char *dataset, ellm_error *err) {
    if (im->n_rows <= 0) return ellm_fail(err, ELLM_ERR_ARG, "imatrix: no tokens were collected");
    if (im->cov_failed) return ellm_fail(err, ELLM_ERR_NOMEM, "imatrix: out of memory while collecting the covariance");
    _Static_assert((int)IM_SLOTS == (int)MODEL_INPUT_GROUPS, "one collection slot per input group");
    const char *const(*names)[MODEL_INPUT_GROUP_MAX] = model_input_groups; /* slot s reads group s's input */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return ellm_fail(err, ELLM_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    int32_t n_entries = 0;
    for (int s = 0; s < IM_SLOTS; s++)
        for (int k = 0; k < MODEL_INPUT_GROUP_MAX; k++) n_entries += names[s][k] ? im->n_layer * (im->cov_block && !k ? 2 : 1) : 0;
    int ok = fwrite(&n_entries, 4, 1, f) == 1;
    int32_t ncall = (int32_t)(im->n_calls > 0 ? im->n_calls : 1);
    int64_t max_cols = 1;
    for (int s = 0; s < IM_SLOTS; s++)
        if (im->cols[s] * (im->cov_block ? im->cov_block : 1) > max_cols)
            max_cols = im->cols[s] * (im->cov_block ? im->cov_block : 1);
    float *vals = malloc((size_t)max_cols * sizeof(float));
    ok = ok && vals;
    for (int l = 0; l < im->n_layer && ok; l++)
        for (int s = 0; s < IM_SLOTS && ok; s++)
            for (int k = 0; k < MODEL_INPUT_GROUP_MAX && ok && names[s][k]; k++) {
                char name[96];
                int32_t len = snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[s][k]);
                int32_t nval = (int32_t)im->cols[s];
                const double *sum = im->sum[s] + (size_t)l * (size_t)im->cols[s];
                for (int64_t c = 0; c < im->cols[s]; c++) vals[c] = (float)(sum[c] / (double)im->n_rows * ncall);
                ok = fwrite(&len, 4, 1, f) == 1 && fwrite(name, 1, (size_t)len, f) == (size_t)len &&
                     fwrite(&ncall, 4, 1, f) == 1 && fwrite(&nval, 4, 1, f) == 1 &&
                     fwrite(vals, 4, (size_t)nval, f) == (size_t)nval;
                /* one covariance per input: under the first matrix that reads it */
                if (ok && im->cov_block && k == 0) ok = write_cov(f, im, l, s, name, ncall, vals);
            }
    int32_t last_chunk = ncall, dlen = (int32_t)strlen(dataset ? dataset : "");
    ok = ok && fwrite(&last_chunk, 4, 1, f) == 1 && fwrite(&dlen, 4, 1, f) == 1 &&
         fwrite(dataset ? dataset : "", 1, (size_t)dlen, f) == (size_t)dlen;
    free(vals);
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return ellm_fail(err, ELLM_ERR_IO, "writing '%s': %s", path, strerror(errno));
    }
    return ELLM_OK;
}
