/* Sparse attention through the engine: exact when the budget covers the
 * context, close to dense on trained attention, consistent under truncation,
 * and profiles validated. Uses the embedded evaluation model. */
#include "ellm.h"
#include "harness.h"

#include <string.h>

#define T 640

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(void) {
    ellm_model *m = NULL;
    ellm_error err = {0};
    CHECK(ellm_model_load("models/evalmodel.gguf", NULL, &m, &err) == ELLM_OK, "%s", err.msg);
    if (!m) return test_finish();
    ellm_model_info info;
    ellm_model_get_info(m, &info);
    const int V = info.n_vocab;
    char path[512];
    snprintf(path, sizeof path, "%s/heldout-sample.txt", test_data_dir());
    size_t len = 0;
    char *text = test_read_file(path, &len);
    CHECK(text != NULL, "%s", path);
    static int32_t ids[200000];
    int n = 0;
    CHECK(ellm_tokenize(m, text, len, 0, 0, ids, 200000, &n, &err) == ELLM_OK && n > T, "%s", err.msg);
    free(text);

    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = T;
    cp.sparse_recall_every = 8;
    ellm_context *ctx = NULL;
    CHECK(ellm_context_init(m, &cp, &ctx, &err) == ELLM_OK, "%s", err.msg);
    float *dense = malloc((size_t)T * V * 4), *sp = malloc((size_t)T * V * 4);

    /* dense reference, token by token (the sparse runs below are too) */
    for (int i = 0; i < T; i++) ellm_decode(ctx, &ids[i], 1, dense + (size_t)i * V, &err);

    /* budget >= context: bit-identical to dense */
    ellm_context_truncate(ctx, 0);
    CHECK(ellm_context_set_sparse(ctx, T, &err) == ELLM_OK, "%s", err.msg);
    for (int i = 0; i < T; i++) ellm_decode(ctx, &ids[i], 1, sp + (size_t)i * V, &err);
    CHECK(!memcmp(dense, sp, (size_t)T * V * 4), "budget >= context differs from dense");

    /* budget 256 of 640: sparse steps happen, outputs stay close to dense */
    ellm_context_truncate(ctx, 0);
    ellm_context_set_sparse(ctx, 256, &err);
    ellm_context_stats st0;
    ellm_context_get_stats(ctx, &st0);
    for (int i = 0; i < T; i++) ellm_decode(ctx, &ids[i], 1, sp + (size_t)i * V, &err);
    ellm_context_stats st1;
    ellm_context_get_stats(ctx, &st1);
    CHECK(st1.sparse_steps - st0.sparse_steps >= T - 300, "sparse steps: %lld",
          (long long)(st1.sparse_steps - st0.sparse_steps));
    CHECK(st1.attended_tokens <= 256 + 32, "attended %.1f tokens per head with budget 256", st1.attended_tokens);
    CHECK(st1.recall_samples > 0 && st1.sparse_recall > 0.3 && st1.sparse_recall < 1.0, "recall %.3f (%lld samples)",
          st1.sparse_recall, (long long)st1.recall_samples);
    int agree = 0, scored = 0, differs = 0;
    for (int i = 300; i < T; i++) {
        agree += argmax(sp + (size_t)i * V, V) == argmax(dense + (size_t)i * V, V);
        differs |= memcmp(sp + (size_t)i * V, dense + (size_t)i * V, (size_t)V * 4) != 0;
        scored++;
    }
    CHECK(differs, "sparse logits identical to dense: selection had no effect");
    CHECK(agree >= 0.85 * scored, "top-1 agreement %d/%d", agree, scored);
    printf("budget 256 of %d: top-1 agreement %d/%d, recall %.3f\n", T, agree, scored, st1.sparse_recall);

    /* truncation keeps the index exact: truncate to 400, re-feed, same logits */
    ellm_context_truncate(ctx, 400);
    float *row = malloc((size_t)V * 4);
    int same = 1;
    for (int i = 400; i < T; i++) {
        ellm_decode(ctx, &ids[i], 1, row, &err);
        same &= !memcmp(row, sp + (size_t)i * V, (size_t)V * 4);
    }
    CHECK(same, "logits after truncation and re-feeding differ");

    /* profiles: a good one loads, bad ones are refused with the reason */
    FILE *f = fopen("/tmp/ellm_test_profile.txt", "w");
    fprintf(f, "ellm-sparse-profile 1\nlayers %d kv_heads %d\n# comment\n", info.n_layer, info.n_head_kv);
    for (int l = 0; l < info.n_layer; l++) {
        fprintf(f, "layer %d %s", l, l == 0 ? "dense" : "sparse");
        for (int h = 0; h < info.n_head_kv; h++) fprintf(f, " %.2f", h ? 0.5 : 1.5);
        fputc('\n', f);
    }
    fclose(f);
    CHECK(ellm_context_load_sparse_profile(ctx, "/tmp/ellm_test_profile.txt", &err) == ELLM_OK, "%s", err.msg);
    f = fopen("/tmp/ellm_test_profile.txt", "w");
    fprintf(f, "ellm-sparse-profile 1\nlayers 99 kv_heads 2\n");
    fclose(f);
    CHECK(ellm_context_load_sparse_profile(ctx, "/tmp/ellm_test_profile.txt", &err) == ELLM_ERR_FORMAT &&
              strstr(err.msg, "99"), "wrong shape: %s", err.msg);
    f = fopen("/tmp/ellm_test_profile.txt", "w");
    fprintf(f, "ellm-sparse-profile 1\nlayers %d kv_heads %d\nlayer 0 sparse -1 2\n", info.n_layer, info.n_head_kv);
    fclose(f);
    CHECK(ellm_context_load_sparse_profile(ctx, "/tmp/ellm_test_profile.txt", &err) == ELLM_ERR_FORMAT &&
              strstr(err.msg, "weight"), "bad weight: %s", err.msg);
    CHECK(ellm_context_load_sparse_profile(ctx, "/nonexistent/profile", &err) == ELLM_ERR_IO, "missing file");
    remove("/tmp/ellm_test_profile.txt");

    /* a dense-only context refuses sparse */
    ellm_context *dctx = NULL;
    cp.sparse_topk = -1;
    CHECK(ellm_context_init(m, &cp, &dctx, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_context_set_sparse(dctx, 128, &err) == ELLM_ERR_ARG, "dense-only context accepted sparse");
    ellm_context_free(dctx);

    free(row);
    free(dense);
    free(sp);
    ellm_context_free(ctx);
    ellm_model_free(m);
    return test_finish();
}
