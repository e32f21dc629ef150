/* Options and the window pass shared by the calibrate subcommands that fit
 * something over sample text (cmd_imatrix.c, cmd_draft.c). */
#include "cli/calib.h"
#include "cli/args.h"

#include <stdio.h>

int calib_arg(int argc, char **argv, int *i, calib_opts *o, int *bad) {
    const char *v = NULL;
    if (arg_value(argc, argv, i, "--model", "-m", &v, bad)) {
        o->model_path = v;
    } else if (arg_value(argc, argv, i, "--file", "-f", &v, bad)) {
        o->text_path = v;
    } else if (arg_value(argc, argv, i, "--output", "-o", &v, bad)) {
        o->out = v;
    } else if (arg_value(argc, argv, i, "--ctx", "-c", &v, bad)) {
        if (v && !arg_int("--ctx", v, 16, 1 << 20, &o->ctx_len)) *bad = 1;
    } else {
        return 0;
    }
    return 1;
}

long calib_windows(ellm_context *ctx, const calib_opts *o, const int32_t *ids, int n_ids, long max_windows,
                   const char *label, calib_collect_fn collect, void *acc) {
    long n_win = n_ids / o->ctx_len;
    if (max_windows > 0 && n_win > max_windows) n_win = max_windows;
    if (n_win < 1) {
        fprintf(stderr, "error: %s has %d tokens, fewer than one --ctx window of %ld\n", o->text_path, n_ids,
                o->ctx_len);
        return 0;
    }
    ellm_error err = {0};
    for (long w = 0; w < n_win; w++) {
        if (collect(ctx, acc, ids + w * o->ctx_len, (int)o->ctx_len, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            return 0;
        }
        fprintf(stderr, "\r%s: %ld/%ld windows", label, w + 1, n_win);
    }
    fputc('\n', stderr);
    return n_win;
}
