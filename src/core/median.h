/* Medians of timing samples. */
#ifndef ELLM_CORE_MEDIAN_H
#define ELLM_CORE_MEDIAN_H

#include <stdlib.h>

static inline int median_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v (n >= 1 values) ascending in place and returns v[n / 2]: the
 * median, the upper of the two middle values for even n. v[0] is then the
 * minimum. */
static inline double median_sort(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, median_cmp_double);
    return v[n / 2];
}

#endif
