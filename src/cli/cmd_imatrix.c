/* `ellm calibrate --imatrix`: the importance matrix of a model over sample
 * text (per input column of every layer matrix, the mean squared
 * activation), for `ellm convert --imatrix`. */
#include "cli/args.h"
#include "cli/commands.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_calibrate_imatrix(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL, *out = NULL;
    long ctx_len = 512, chunks = 0;
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "--imatrix")) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: ellm calibrate --imatrix -f TEXT -o FILE [-m MODEL] [--ctx N] [--chunks N]\n\n"
                   "Runs the model over TEXT in windows of --ctx tokens (default 512; at most --chunks\n"
                   "windows, default all) and writes, per input column of every layer matrix, the\n"
                   "mean squared activation (llama.cpp's imatrix .dat layout) for\n"
                   "`ellm convert --imatrix FILE`. The model should be the F32/F16 one.\n");
            return 0;
        } else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) {
            model_path = v;
        } else if (arg_value(argc, argv, &i, "--file", "-f", &v, &bad)) {
            text_path = v;
        } else if (arg_value(argc, argv, &i, "--output", "-o", &v, &bad)) {
            out = v;
        } else if (arg_value(argc, argv, &i, "--ctx", "-c", &v, &bad)) {
            if (v && !arg_int("--ctx", v, 16, 1 << 20, &ctx_len)) bad = 1;
        } else if (arg_value(argc, argv, &i, "--chunks", NULL, &v, &bad)) {
            if (v && !arg_int("--chunks", v, 1, 1 << 20, &chunks)) bad = 1;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see ellm calibrate --imatrix --help)\n", a);
            bad = 1;
        }
    }
    if (bad) return 2;
    if (!text_path || !out) {
        fprintf(stderr, "error: -f TEXT and -o FILE are required\n");
        return 2;
    }
    if (!model_path) model_path = cli_default_model();
    ellm_error err = {0};
    ellm_model *m = NULL;
    ellm_context *ctx = NULL;
    ellm_imatrix *im = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1;
    if (ellm_model_load(model_path, NULL, &m, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    if (!(ids = cli_tokenize_file(m, text_path, 0, &n_ids))) goto done;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = (int)ctx_len;
    if (ellm_context_init(m, &cp, &ctx, &err) || ellm_imatrix_init(m, &im, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    long n_win = n_ids / ctx_len;
    if (chunks > 0 && n_win > chunks) n_win = chunks;
    if (n_win < 1) {
        fprintf(stderr, "error: %s has %d tokens, fewer than one --ctx window of %ld\n", text_path, n_ids, ctx_len);
        goto done;
    }
    for (long w = 0; w < n_win; w++) {
        if (ellm_imatrix_collect(ctx, im, ids + w * ctx_len, (int)ctx_len, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
        fprintf(stderr, "\rimatrix: %ld/%ld windows", w + 1, n_win);
    }
    fputc('\n', stderr);
    if (ellm_imatrix_write(im, out, text_path, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    fprintf(stderr, "imatrix: wrote %s from %ld tokens of %s\n", out, n_win * ctx_len, text_path);
    rc = 0;
done:
    ellm_imatrix_free(im);
    ellm_context_free(ctx);
    ellm_model_free(m);
    free(ids);
    return rc;
}
