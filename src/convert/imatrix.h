/* Reader of importance-matrix files (llama.cpp's imatrix .dat layout, as
 * `ellm calibrate --imatrix` writes it): per weight matrix name, the mean
 * squared activation of each input column. Safe on untrusted input; a
 * failure names the file and the entry. */
#ifndef ELLM_CONVERT_IMATRIX_H
#define ELLM_CONVERT_IMATRIX_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *name;     /* "blk.0.attn_q.weight" */
    float *values;  /* (n) mean squared activation per input column */
    int64_t n;
} cv_imatrix_entry;

typedef struct {
    cv_imatrix_entry *e;
    int n;
} cv_imatrix;

/* Parses `size` bytes of an imatrix file (`what` names it in messages). */
ellm_status cv_imatrix_parse(const void *data, size_t size, const char *what, cv_imatrix *im, ellm_error *err);
/* Reads and parses the file at `path`. */
ellm_status cv_imatrix_load(const char *path, cv_imatrix *im, ellm_error *err);
/* The values for tensor `name` with `n` input columns, or NULL (absent). */
const float *cv_imatrix_find(const cv_imatrix *im, const char *name, int64_t n);
/* The covariance entry of tensor `name`'s input, with `n` input columns
 * ("<name>.cov", n x B values; attn_k and attn_v find attn_q's, ffn_up
 * ffn_gate's, which share their input), and its block width B through
 * *block, or NULL (absent, or not n x B values with B a multiple of 32). */
const float *cv_imatrix_find_cov(const cv_imatrix *im, const char *name, int64_t n, int *block);
void cv_imatrix_free(cv_imatrix *im);

#endif
