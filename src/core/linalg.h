/* Small dense symmetric positive-definite systems in double precision: the
 * Cholesky factor and the solves on it. For fits done once per file or per
 * block (draft maps, error-feedback rounding), not for per-token work. */
#ifndef ELLM_CORE_LINALG_H
#define ELLM_CORE_LINALG_H

/* Factors A + lambda I = L L^T in place: L in the lower triangle of A (n x n,
 * row-major, symmetric; the upper triangle is left as it was). Returns 0, or
 * -1 if A + lambda I is not positive definite. */
int linalg_cholesky(double *A, int n, double lambda);

/* Solves L L^T X = B for X in place of B (n rows of m columns, row-major),
 * L from linalg_cholesky. */
void linalg_cholesky_solve(const double *L, double *B, int n, int m);

/* The inverse of L L^T into Ainv (n x n, both triangles), L from
 * linalg_cholesky: L^-1 by substitution, then L^-T L^-1. W: n x n scratch. */
void linalg_cholesky_inverse(const double *L, double *Ainv, double *W, int n);

#endif
