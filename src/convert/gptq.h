/* Error-feedback (GPTQ-style) rounding of weight rows to Q4_0 or INT4_G128
 * from the covariance of each matrix's inputs, which `ellm calibrate
 * --imatrix --covariance` writes per block of B input columns.
 *
 * Rounding each weight to its nearest level minimizes the weights' own
 * error; what matters is the output's, sum over inputs x of ((w - wq) . x)^2
 * = e^T H e with e = w - wq and H the inputs' second moment. Taking the
 * columns of a block in order, GPTQ rounds one and moves its rounding error
 * onto the columns not yet rounded, in the proportions that H's inverse
 * gives, so later roundings cancel what earlier ones broke (Frantar et al.,
 * "GPTQ", 2022, with H restricted to blocks of B columns). */
#ifndef ELLM_CONVERT_GPTQ_H
#define ELLM_CONVERT_GPTQ_H

#include <stdint.h>

/* Readies the covariance of a matrix with `cols` input columns (cov: cols x
 * B values, row c holding column c's products with the B columns of its
 * block, as the imatrix ".cov" entries): H = cov + damp x its mean diagonal
 * (a column never seen weighs as the mean), U = the upper Cholesky factor
 * of H's inverse, per block. H and U: cols x B floats in the same layout.
 * Returns 0 if a block is not positive definite. */
int gptq_prepare(const float *cov, int64_t cols, int B, double damp, float *H, float *U);

/* Scratch for gptq_quantize_row on rows of up to n columns, one per thread
 * (about 150 KB): NULL when out of memory. */
typedef struct gptq_scratch gptq_scratch;
gptq_scratch *gptq_scratch_new(int64_t n);
void gptq_scratch_free(gptq_scratch *S);

/* One row x of n columns into `type` (QTYPE_Q4_0 or QTYPE_INT4_G128, n and
 * B multiples of its group) at dst: per block, the element-wise weighted
 * quantizer's result (weights from `imatrix`, as qtype_quantize_weighted)
 * and GPTQ_PASSES error-feedback passes, each followed by a least-squares
 * refit of the block's scales (and offsets) to e^T H e; the candidate of
 * smallest e^T H e is written. Returns 0 (nothing written) for another
 * type, a shape it cannot take or a row longer than S was made for. */
int gptq_quantize_row(int type, const float *x, void *dst, int64_t n, const float *imatrix, const float *H,
                      const float *U, int B, gptq_scratch *S);

#endif
