/* `ellm calibrate --imatrix`: the importance matrix of a model over sample
 * text (per input column of every layer matrix, the mean squared
 * activation), for `ellm convert --imatrix`. */
#include "cli/args.h"
#include "cli/calib.h"
#include "cli/commands.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Default covariance block (--cov-block): on the evaluation model, blocks
 * of 128, 256 and 512 columns gave int4-g128 KL divergences from F32 of
 * 0.00234, 0.00210 and 0.00195 (bench/CONVERT.md); the file grows with the
 * block (per matrix input, columns x block floats). */
#define IM_COV_BLOCK 256

static ellm_status collect(ellm_context *ctx, void *im, const int32_t *tokens, int n, ellm_error *err) {
    return ellm_imatrix_collect(ctx, im, tokens, n, err);
}

int cmd_calibrate_imatrix(int argc, char **argv) {
    calib_opts o = {.ctx_len = 512};
    long chunks = 0, cov_block = IM_COV_BLOCK;
    int bad = 0, covariance = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "--imatrix") || calib_arg(argc, argv, &i, &o, &bad)) continue;
        if (!strcmp(a, "--covariance")) {
            covariance = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: ellm calibrate --imatrix -f TEXT -o FILE [-m MODEL] [--ctx N] [--chunks N]\n"
                   "                              [--covariance [--cov-block N]]\n\n"
                   "Runs the model over TEXT in windows of --ctx tokens (default 512; at most --chunks\n"
                   "windows, default all) and writes, per input column of every layer matrix, the\n"
                   "mean squared activation (llama.cpp's imatrix .dat layout) for\n"
                   "`ellm convert --imatrix FILE`. The model should be the F32/F16 one.\n"
                   "--covariance also writes the covariance of each matrix input within blocks of\n"
                   "--cov-block columns (a multiple of 128 up to 1024; default %d) as entries\n"
                   "\"<name>.cov\" (columns x block floats each; Q, K and V share attn_q's, gate\n"
                   "and up ffn_gate's): `ellm convert --imatrix` then\n"
                   "rounds q4_0 and int4-g128 with error feedback (GPTQ-style) instead of value\n"
                   "by value. Larger blocks measure better and make larger files.\n", IM_COV_BLOCK);
            return 0;
        } else if (arg_value(argc, argv, &i, "--cov-block", NULL, &v, &bad)) {
            covariance = 1;
            if (v && (!arg_int("--cov-block", v, 128, 1024, &cov_block) || cov_block % 128)) {
                if (cov_block % 128) fprintf(stderr, "error: --cov-block must be a multiple of 128\n");
                bad = 1;
            }
        } else if (arg_value(argc, argv, &i, "--chunks", NULL, &v, &bad)) {
            if (v && !arg_int("--chunks", v, 1, 1 << 20, &chunks)) bad = 1;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see ellm calibrate --imatrix --help)\n", a);
            bad = 1;
        }
    }
    if (bad) return 2;
    if (!o.text_path || !o.out) {
        fprintf(stderr, "error: -f TEXT and -o FILE are required\n");
        return 2;
    }
    if (!o.model_path) o.model_path = cli_default_model();
    ellm_error err = {0};
    ellm_model *m = NULL;
    ellm_context *ctx = NULL;
    ellm_imatrix *im = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1;
    if (ellm_model_load(o.model_path, NULL, &m, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    if (!(ids = cli_tokenize_file(m, o.text_path, 0, &n_ids))) goto done;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = (int)o.ctx_len;
    if (ellm_context_init(m, &cp, &ctx, &err) || ellm_imatrix_init(m, &im, &err) ||
        (covariance && ellm_imatrix_set_covariance(im, (int)cov_block, &err))) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    long n_win = calib_windows(ctx, &o, ids, n_ids, chunks, "imatrix", collect, im);
    if (!n_win) goto done;
    if (ellm_imatrix_write(im, o.out, o.text_path, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    fprintf(stderr, "imatrix: wrote %s from %ld tokens of %s\n", o.out, n_win * o.ctx_len, o.text_path);
    rc = 0;
done:
    ellm_imatrix_free(im);
    ellm_context_free(ctx);
    ellm_model_free(m);
    free(ids);
    return rc;
}
