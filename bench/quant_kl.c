/* Fidelity of quantized models against a reference model (usually its F32
 * version): over windows of held-out text, teacher-forced, the mean KL
 * divergence KL(p_ref || p_model) of the next-token distributions, how often
 * the two argmaxes agree, and the model's perplexity. Perplexity alone moves
 * by chance with the exact rounding of each weight (a quantized model can
 * score below F32); the KL divergence measures how far the model's
 * predictions moved from the reference's, so it ranks quantizers.
 *
 * usage: quant_kl REF.gguf TEXT WINDOWS MODEL.gguf [MODEL.gguf ...]
 * Windows of 2048 tokens (or the models' training context, if smaller) from
 * the start of TEXT; positions 256.. of each window are scored, as `ellm eval
 * --ctx 2048` does. One JSON line per model. */
#include "ellm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SCORE_FROM = 256 };

/* log softmax of n logits into out */
static void log_softmax(const float *l, int n, double *out) {
    double mx = l[0], s = 0;
    for (int i = 1; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < n; i++) s += exp(l[i] - mx);
    double ls = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = l[i] - ls;
}

static char *read_file(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0 && (*len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)*len + 1)) && fread(buf, 1, (size_t)*len, f) != (size_t)*len) {
        free(buf);
        buf = NULL;
    }
    if (f) fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: quant_kl REF.gguf TEXT WINDOWS MODEL.gguf [MODEL.gguf ...]\n");
        return 2;
    }
    ellm_error err = {0};
    int n_win = atoi(argv[3]), nm = argc - 4, rc = 1;
    long len = 0;
    char *text = read_file(argv[2], &len);
    if (!text || n_win < 1) {
        fprintf(stderr, "error: cannot read '%s' or bad window count '%s'\n", argv[2], argv[3]);
        return 2;
    }
    ellm_model *ref = NULL;
    ellm_context *cref = NULL;
    if (ellm_model_load(argv[1], NULL, &ref, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    ellm_model_info info;
    ellm_model_get_info(ref, &info);
    const int V = info.n_vocab, ctx = info.n_ctx_train > 0 && info.n_ctx_train < 2048 ? info.n_ctx_train : 2048;
    int32_t *ids = malloc(((size_t)len + 16) * sizeof *ids);
    int n_ids = 0;
    if (!ids || ellm_tokenize(ref, text, (size_t)len, 0, 0, ids, (int)len + 16, &n_ids, &err)) {
        fprintf(stderr, "error: cannot tokenize '%s': %s\n", argv[2], ids ? err.msg : "out of memory");
        return 1;
    }
    if (n_win > n_ids / ctx) n_win = n_ids / ctx;
    if (n_win < 1 || ctx <= SCORE_FROM + 1) {
        fprintf(stderr, "error: '%s' has %d tokens, fewer than one window of %d\n", argv[2], n_ids, ctx);
        return 1;
    }
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = ctx;
    ellm_model **m = calloc((size_t)nm, sizeof *m);
    ellm_context **c = calloc((size_t)nm, sizeof *c);
    float *lr = malloc((size_t)ctx * V * sizeof(float)), *lm = malloc((size_t)ctx * V * sizeof(float));
    double *pr = malloc((size_t)V * sizeof(double)), *pm = malloc((size_t)V * sizeof(double));
    double *kl = calloc((size_t)nm, sizeof(double)), *nll = calloc((size_t)nm, sizeof(double));
    long *agree = calloc((size_t)nm, sizeof(long)), npos = 0;
    if (!m || !c || !lr || !lm || !pr || !pm || !kl || !nll || !agree || ellm_context_init(ref, &cp, &cref, &err)) {
        fprintf(stderr, "error: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    for (int k = 0; k < nm; k++) {
        ellm_model_info mi;
        if (ellm_model_load(argv[4 + k], NULL, &m[k], &err) || ellm_context_init(m[k], &cp, &c[k], &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
        ellm_model_get_info(m[k], &mi);
        if (mi.n_vocab != V) {
            fprintf(stderr, "error: '%s' has %d vocabulary entries, the reference %d\n", argv[4 + k], mi.n_vocab, V);
            goto done;
        }
    }
    for (int w = 0; w < n_win; w++) {
        const int32_t *t = ids + (size_t)w * ctx;
        ellm_context_truncate(cref, 0);
        if (ellm_decode(cref, t, ctx, lr, &err)) goto fail;
        for (int k = 0; k < nm; k++) {
            ellm_context_truncate(c[k], 0);
            if (ellm_decode(c[k], t, ctx, lm, &err)) goto fail;
            for (int p = SCORE_FROM; p < ctx - 1; p++) {
                log_softmax(lr + (size_t)p * V, V, pr);
                log_softmax(lm + (size_t)p * V, V, pm);
                double s = 0;
                int ar = 0, am = 0;
                for (int i = 0; i < V; i++) {
                    s += exp(pr[i]) * (pr[i] - pm[i]);
                    ar = pr[i] > pr[ar] ? i : ar;
                    am = pm[i] > pm[am] ? i : am;
                }
                kl[k] += s;
                agree[k] += ar == am;
                nll[k] -= pm[t[p + 1]];
            }
        }
        npos += ctx - 1 - SCORE_FROM;
    }
    for (int k = 0; k < nm; k++)
        printf("{\"model\": \"%s\", \"reference\": \"%s\", \"windows\": %d, \"positions\": %ld, \"kl\": %.7f, "
               "\"top1\": %.5f, \"ppl\": %.5f}\n",
               argv[4 + k], argv[1], n_win, npos, kl[k] / npos, (double)agree[k] / npos, exp(nll[k] / npos));
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "error: %s\n", err.msg);
done:
    for (int k = 0; k < nm; k++) {
        ellm_context_free(c ? c[k] : NULL);
        ellm_model_free(m ? m[k] : NULL);
    }
    ellm_context_free(cref);
    ellm_model_free(ref);
    free(m);
    free(c);
    free(lr);
    free(lm);
    free(pr);
    free(pm);
    free(kl);
    free(nll);
    free(agree);
    free(ids);
    free(text);
    return rc;
}
