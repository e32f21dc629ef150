/* `ellm calibrate --draft`: draft maps for shallow:K drafters (a least-squares
 * linear map from the residual stream after K layers to the last layer's),
 * for `ellm run --spec shallow:K --draft-map FILE`. */
#include "cli/args.h"
#include "cli/calib.h"
#include "cli/commands.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ellm_status collect(ellm_context *ctx, void *dc, const int32_t *tokens, int n, ellm_error *err) {
    return ellm_draft_calib_collect(ctx, dc, tokens, n, err);
}

int cmd_calibrate_draft(int argc, char **argv) {
    calib_opts o = {.ctx_len = 1024};
    const char *layers_arg = NULL;
    long windows = 0;
    int bad = 0, raw = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "--draft") || calib_arg(argc, argv, &i, &o, &bad)) continue;
        if (!strcmp(a, "--draft-raw")) {
            raw = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: ellm calibrate --draft -f TEXT -o DRAFT [-m MODEL] [--draft-layers K,K,...]\n"
                   "       [--ctx N] [--windows N] [--draft-raw]\n\n"
                   "Runs the model over TEXT in windows of --ctx tokens (default 1024; at most\n"
                   "--windows, default all) and fits, for each K of --draft-layers (default every K\n"
                   "from 1 to the model's layers - 1), a linear map from the residual stream after\n"
                   "the first K layers to the stream after the last one (least squares with a small\n"
                   "ridge), both streams scaled to unit RMS (as the head sees them after the output\n"
                   "norm; --draft-raw: unscaled). DRAFT is a small GGUF for `--spec shallow:K\n"
                   "--draft-map DRAFT`.\n");
            return 0;
        } else if (arg_value(argc, argv, &i, "--draft-layers", NULL, &v, &bad)) {
            layers_arg = v;
        } else if (arg_value(argc, argv, &i, "--windows", NULL, &v, &bad)) {
            if (v && !arg_int("--windows", v, 1, 1 << 20, &windows)) bad = 1;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see ellm calibrate --draft --help)\n", a);
            bad = 1;
        }
    }
    if (bad) return 2;
    if (!o.text_path || !o.out) {
        fprintf(stderr, "error: -f TEXT and -o DRAFT are required\n");
        return 2;
    }
    if (!o.model_path) o.model_path = cli_default_model();
    ellm_error err = {0};
    ellm_model *m = NULL;
    ellm_context *ctx = NULL;
    ellm_draft_calib *dc = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1, layers[256], n_layers = 0;
    if (ellm_model_load(o.model_path, NULL, &m, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    if (!(ids = cli_tokenize_file(m, o.text_path, 1, &n_ids))) goto done;
    ellm_model_info info;
    ellm_model_get_info(m, &info);
    if (layers_arg) {
        n_layers = arg_int_list("--draft-layers", layers_arg, 1, info.n_layer - 1, layers, 256);
        if (n_layers < 1) {
            rc = 2;
            goto done;
        }
    } else {
        for (int k = 1; k < info.n_layer && n_layers < 256; k++) layers[n_layers++] = k;
    }
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = (int)o.ctx_len;
    cp.sparse_topk = -1;
    if (ellm_context_init(m, &cp, &ctx, &err) || ellm_draft_calib_init(m, layers, n_layers, !raw, &dc, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    long n_win = calib_windows(ctx, &o, ids, n_ids, windows, "draft maps", collect, dc);
    if (!n_win) goto done;
    if (ellm_draft_calib_write(dc, o.out, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    fprintf(stderr, "wrote %d draft maps (%d x %d) fitted on %ld tokens to %s\n", n_layers, info.n_embd, info.n_embd,
            n_win * o.ctx_len, o.out);
    rc = 0;
done:
    ellm_draft_calib_free(dc);
    ellm_context_free(ctx);
    ellm_model_free(m);
    free(ids);
    return rc;
}
