/* Importance-matrix reader (see imatrix.h). Layout, little-endian: i32
 * n_entries; per entry i32 name length, name, i32 ncall, i32 nval, nval
 * float32 (mean x^2 times ncall); a trailing chunk count and dataset name
 * are ignored. */
#include "convert/imatrix.h"

#include "convert/fileio.h"
#include "core/status.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cv_imatrix_free(cv_imatrix *im) {
    for (int i = 0; im->e && i < im->n; i++) {
        free(im->e[i].name);
        free(im->e[i].values);
    }
    free(im->e);
    im->e = NULL;
    im->n = 0;
}

static int rd_i32(const uint8_t **p, const uint8_t *end, int32_t *v) {
    if (end - *p < 4) return 0;
    memcpy(v, *p, 4);
    *p += 4;
    return 1;
}

ellm_status cv_imatrix_parse(const void *data, size_t size, const char *what, cv_imatrix *im, ellm_error *err) {
    memset(im, 0, sizeof *im);
    const uint8_t *p = data, *end = p + size;
    int32_t n;
    if (!rd_i32(&p, end, &n) || n < 0 || (size_t)n > size / 13)
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': bad entry count (not an imatrix file?)", what);
    im->e = calloc((size_t)(n ? n : 1), sizeof *im->e);
    if (!im->e) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        int32_t len, ncall, nval;
        if (!rd_i32(&p, end, &len) || len <= 0 || len > 1024 || end - p < len) {
            cv_imatrix_free(im);
            return ellm_fail(err, ELLM_ERR_FORMAT, "'%s': entry %d: bad name length", what, i);
        }
        cv_imatrix_entry *e = &im->e[im->n];
        e->name = malloc((size_t)len + 1);
        if (!e->name) {
            cv_imatrix_free(im);
            return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
        }
        memcpy(e->name, p, (size_t)len);
        e->name[len] = 0;
        p += len;
        im->n++;
        if (!rd_i32(&p, end, &ncall) || !rd_i32(&p, end, &nval) || ncall <= 0 || nval <= 0 ||
            (size_t)(end - p) / 4 < (size_t)nval) {
            ellm_status st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': entry '%.100s': bad counts or truncated values",
                                       what, e->name);
            cv_imatrix_free(im);
            return st;
        }
        e->n = nval;
        const size_t nl = strlen(e->name);
        const int is_cov = nl > 4 && !strcmp(e->name + nl - 4, ".cov"); /* covariances may be negative */
        e->values = malloc((size_t)nval * sizeof(float));
        if (!e->values) {
            cv_imatrix_free(im);
            return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
        }
        memcpy(e->values, p, (size_t)nval * 4);
        p += (size_t)nval * 4;
        for (int32_t k = 0; k < nval; k++) {
            float v = e->values[k] / (float)ncall;
            if (!isfinite(v) || (!(v >= 0) && !is_cov)) {
                ellm_status st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': entry '%.100s': value %d is not a finite%s "
                                           "number", what, e->name, k, is_cov ? "" : " non-negative");
                cv_imatrix_free(im);
                return st;
            }
            e->values[k] = v;
        }
    }
    return ELLM_OK;
}

ellm_status cv_imatrix_load(const char *path, cv_imatrix *im, ellm_error *err) {
    /* mapped, not read into a buffer: a covariance file of a large model
     * can pass 2 GB, and the parse copies each entry out anyway */
    const void *data = NULL;
    size_t len = 0;
    memset(im, 0, sizeof *im);
    ellm_status st = cv_map_file(path, &data, &len, err);
    if (st == ELLM_OK) st = cv_imatrix_parse(data ? data : "", len, path, im, err);
    cv_unmap_file(data, len);
    return st;
}

const float *cv_imatrix_find(const cv_imatrix *im, const char *name, int64_t n) {
    for (int i = 0; im && i < im->n; i++)
        if (!strcmp(im->e[i].name, name)) return im->e[i].n == n ? im->e[i].values : NULL;
    return NULL;
}

const float *cv_imatrix_find_cov(const cv_imatrix *im, const char *name, int64_t n, int *block) {
    /* stored once per input, under the first matrix that reads it */
    char owner[1024], cname[1100];
    if (!model_input_owner(name, owner, sizeof owner)) return NULL;
    snprintf(cname, sizeof cname, "%s.cov", owner);
    for (int i = 0; im && n > 0 && i < im->n; i++)
        if (!strcmp(im->e[i].name, cname)) {
            const int64_t B = im->e[i].n / n;
            if (im->e[i].n % n || B < 32 || B % 32 || B > 1024) return NULL;
            *block = (int)B;
            return im->e[i].values;
        }
    return NULL;
}
