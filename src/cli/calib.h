/* What `ellm calibrate --imatrix` and `ellm calibrate --draft` share: the
 * model, sample text, output and window-length options, and the pass that
 * feeds the text to a collector one --ctx window at a time. */
#ifndef ELLM_CLI_CALIB_H
#define ELLM_CLI_CALIB_H

#include "ellm.h"

#include <stdint.h>

typedef struct {
    const char *model_path; /* -m; NULL: the default model */
    const char *text_path;  /* -f: sample text */
    const char *out;        /* -o: file to write */
    long ctx_len;           /* --ctx: tokens per window */
} calib_opts;

/* Returns 1 if argv[*i] is --model/-m, --file/-f, --output/-o or --ctx/-c and
 * stores its value in o, advancing *i; sets *bad (after printing why) when the
 * value is missing or out of range. */
int calib_arg(int argc, char **argv, int *i, calib_opts *o, int *bad);

/* One window of tokens into an accumulator (ellm_imatrix_collect and the like). */
typedef ellm_status (*calib_collect_fn)(ellm_context *ctx, void *acc, const int32_t *tokens, int n, ellm_error *err);

/* Feeds ids (n_ids of them, read from o->text_path) to collect in whole
 * windows of o->ctx_len tokens, at most max_windows of them when > 0, showing
 * "label: w/n windows" on stderr. Returns the number of windows fed, or 0
 * after printing why (the text is shorter than one window, or collect failed). */
long calib_windows(ellm_context *ctx, const calib_opts *o, const int32_t *ids, int n_ids, long max_windows,
                   const char *label, calib_collect_fn collect, void *acc);

#endif
