/* Draft maps for shallow:k drafters: per k, a linear map W_k (d x d) from the
 * residual stream after the first k layers to the stream after the last
 * layer, fitted by least squares on sample text (ellm calibrate --draft):
 *   W_k = argmin sum_t |W h_k(t) - h_L(t)|^2 + lambda |W|^2
 * with lambda a small ridge (1e-4 of the mean squared stream value) so that
 * rarely used directions stay near 0. Normalized maps (the default of ellm
 * calibrate --draft) fit and apply the streams scaled to unit RMS, so every
 * position weighs the same, as the output norm makes the head see it. The
 * file is a small GGUF:
 *   ellm.draft_map.n_embd, ellm.draft_map.n_layer  (u32: the model's)
 *   ellm.draft_map.tokens                          (u64: tokens fitted on)
 *   ellm.draft_map.normalized                      (u32: 1 normalized, 0 raw)
 *   draft_map.K                                    F32 tensor, ne = {d, d},
 *                                                  row i = output channel i */
#ifndef ELLM_SPEC_DRAFT_MAP_H
#define ELLM_SPEC_DRAFT_MAP_H

#include "ellm.h"

/* Reads W_k of `path` for a model of n_embd d and n_layer L into a malloc'ed
 * (d x d) array (*out, the caller frees) and whether it is normalized. ELLM_ERR_FORMAT names a file for
 * another model shape, or without a map for k. Safe on untrusted files. */
ellm_status draft_map_load(const char *path, int d, int n_layer, int k, float **out, int *normalized,
                           ellm_error *err);

/* Solves (A + lambda I) X = B for X in place of B; A (n x n, symmetric
 * positive semi-definite) is overwritten by its Cholesky factor. Returns 0, or
 * -1 if A + lambda I is not positive definite. Exposed for tests. */
int draft_map_solve(double *A, double *B, int n, double lambda);

#endif
