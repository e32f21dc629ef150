/* Cholesky factor and solves (linalg.h). */
#include "core/linalg.h"

#include <math.h>
#include <stddef.h>

int linalg_cholesky(double *A, int n, double lambda) {
    for (int j = 0; j < n; j++) {
        double s = A[(size_t)j * n + j] + lambda;
        for (int k = 0; k < j; k++) s -= A[(size_t)j * n + k] * A[(size_t)j * n + k];
        if (!(s > 0)) return -1;
        double ljj = sqrt(s);
        A[(size_t)j * n + j] = ljj;
        for (int i = j + 1; i < n; i++) {
            double v = A[(size_t)i * n + j];
            for (int k = 0; k < j; k++) v -= A[(size_t)i * n + k] * A[(size_t)j * n + k];
            A[(size_t)i * n + j] = v / ljj;
        }
    }
    return 0;
}

void linalg_cholesky_solve(const double *L, double *B, int n, int m) {
    /* forward (L Y = B) then back (L^T X = Y) substitution, all columns at once */
    for (int i = 0; i < n; i++) {
        double *bi = B + (size_t)i * m;
        for (int k = 0; k < i; k++) {
            double l = L[(size_t)i * n + k];
            const double *bk = B + (size_t)k * m;
            for (int c = 0; c < m; c++) bi[c] -= l * bk[c];
        }
        double inv = 1.0 / L[(size_t)i * n + i];
        for (int c = 0; c < m; c++) bi[c] *= inv;
    }
    for (int i = n - 1; i >= 0; i--) {
        double *bi = B + (size_t)i * m;
        for (int k = i + 1; k < n; k++) {
            double l = L[(size_t)k * n + i];
            const double *bk = B + (size_t)k * m;
            for (int c = 0; c < m; c++) bi[c] -= l * bk[c];
        }
        double inv = 1.0 / L[(size_t)i * n + i];
        for (int c = 0; c < m; c++) bi[c] *= inv;
    }
}

void linalg_cholesky_inverse(const double *L, double *Ainv, double *W, int n) {
    /* W = L^-1, lower triangular */
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = i == j ? 1.0 : 0.0;
            for (int k = j; k < i; k++) s -= L[(size_t)i * n + k] * W[(size_t)k * n + j];
            W[(size_t)i * n + j] = s / L[(size_t)i * n + i];
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0;
            for (int k = i; k < n; k++) s += W[(size_t)k * n + i] * W[(size_t)k * n + j];
            Ainv[(size_t)i * n + j] = Ainv[(size_t)j * n + i] = s;
        }
}
