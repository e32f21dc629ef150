/* Sparse attention through the engine: exact when the budget covers the
 * context, close to dense on trained attention, consistent under truncation,
 * and profiles validated. Uses the embedded evaluation model. */
#include "attention/attention.h"
#include "engine/engine_impl.h"
#include "ellm.h"
#include "harness.h"

#include <limits.h>
#include <string.h>

#define T 640
/* Tokens of one attention part (16-token blocks), and a context 128 tokens
 * past it, a multiple of 64 (the forced-selection check). */
#define PT (ATTENTION_PART_BLOCKS * 16)
#define TF (PT + 128)

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
    CHECK(ellm_tokenize(m, text, len, 0, 0, ids, 200000, &n, &err) == ELLM_OK && n > T && n > TF, "%s", err.msg);
    free(text);

    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = T;
    cp.sparse_recall_every = 8;
    ellm_context *ctx = NULL;
    CHECK(ellm_context_init(m, &cp, &ctx, &err) == ELLM_OK, "%s", err.msg);
    float *dense = malloc((size_t)T * V * 4), *sp = malloc((size_t)T * V * 4);

    /* dense reference, token by token (the sparse runs below are too) */
    for (int i = 0; i < T; i++) ellm_decode(ctx, &ids[i], 1, dense + (size_t)i * V, &err);

    /* budget >= context: the engine skips selection (dense is exact) and the
     * logits are dense's bit for bit. */
    ellm_context_truncate(ctx, 0);
    CHECK(ellm_context_set_sparse(ctx, T, &err) == ELLM_OK, "%s", err.msg);
    ellm_context_stats s0, s1;
    ellm_context_get_stats(ctx, &s0);
    for (int i = 0; i < T; i++) ellm_decode(ctx, &ids[i], 1, sp + (size_t)i * V, &err);
    ellm_context_get_stats(ctx, &s1);
    CHECK(s1.sparse_steps == s0.sparse_steps, "budget >= context took %lld sparse steps",
          (long long)(s1.sparse_steps - s0.sparse_steps));
    CHECK(!memcmp(dense, sp, (size_t)T * V * 4), "budget >= context differs from dense");

    /* The same, with the selection path forced on every layer of every step
     * (1 thread, token by token, then in prefill batches of 64): it must
     * choose every block and attend to them as dense does. While a head's
     * list fits one part of the fused select-and-attend job (PT tokens) the
     * summation order is dense's and the logits are equal bit for bit; longer
     * lists are cut into parts merged by log-sum-exp, equal to dense up to
     * float rounding. TF reaches into the second part. */
    float *fd = malloc((size_t)TF * V * 4), *fs = malloc((size_t)TF * V * 4);
    for (int batched = 0; batched < 2; batched++) {
        ellm_context_params fp = cp;
        fp.n_threads = 1;
        fp.n_ctx = TF;
        fp.n_batch = batched ? 64 : cp.n_batch;
        ellm_context *fctx = NULL;
        CHECK(ellm_context_init(m, &fp, &fctx, &err) == ELLM_OK, "%s", err.msg);
        if (!fctx) break;
        if (batched) {
            ellm_decode(fctx, ids, TF, fd, &err);
        } else {
            for (int i = 0; i < TF; i++) ellm_decode(fctx, &ids[i], 1, fd + (size_t)i * V, &err);
        }
        ellm_context_truncate(fctx, 0);
        CHECK(ellm_context_set_sparse(fctx, TF, &err) == ELLM_OK, "%s", err.msg);
        fctx->sparse_force_select = 1;
        ellm_context_get_stats(fctx, &s0);
        if (batched) {
            ellm_decode(fctx, ids, TF, fs, &err);
        } else {
            for (int i = 0; i < TF; i++) ellm_decode(fctx, &ids[i], 1, fs + (size_t)i * V, &err);
        }
        ellm_context_get_stats(fctx, &s1);
        int passes = batched ? TF / 64 : TF;
        CHECK(s1.sparse_steps - s0.sparse_steps == passes, "forced selection ran on %lld of %d passes",
              (long long)(s1.sparse_steps - s0.sparse_steps), passes);
        int first_diff = -1, top1 = 0;
        double max_rel = 0;
        for (int i = 0; i < TF; i++) {
            const float *a = fd + (size_t)i * V, *b = fs + (size_t)i * V;
            if (first_diff < 0 && memcmp(a, b, (size_t)V * 4)) first_diff = i;
            double md = 0, mr = 0;
            for (int j = 0; j < V; j++) {
                double d = fabs((double)a[j] - b[j]);
                if (!(d <= md)) md = d;
                if (fabs(a[j]) > mr) mr = fabs(a[j]);
            }
            if (!(md / mr <= max_rel)) max_rel = md / mr;
            top1 += test_argmax(a, V) == test_argmax(b, V);
        }
        CHECK(first_diff < 0 || first_diff >= PT, "%s: forced selection differs from dense at position %d",
              batched ? "batched" : "token by token", first_diff);
        CHECK(max_rel <= 5e-5, "%s: forced selection max|d|/max|dense| %.3g", batched ? "batched" : "token by token",
              max_rel);
        CHECK(top1 == TF, "%s: forced selection top-1 agrees on %d/%d", batched ? "batched" : "token by token",
              top1, TF);
        printf("budget >= context, selection forced (%s): bit-equal to dense through position %d, "
               "max|d|/max|dense| %.2g\n", batched ? "batches of 64" : "token by token",
               first_diff < 0 ? TF - 1 : first_diff - 1, max_rel);
        ellm_context_free(fctx);
    }
    free(fd);
    free(fs);

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
    /* measured: 256.0 tokens, recall 0.837, top-1 327/340 (AVX-512) */
    CHECK(st1.attended_tokens <= 256 && st1.attended_tokens >= 240, "attended %.1f tokens per head with budget 256",
          st1.attended_tokens);
    CHECK(st1.recall_samples > 0 && st1.sparse_recall > 0.80 && st1.sparse_recall < 0.95,
          "recall %.3f (%lld samples)", st1.sparse_recall, (long long)st1.recall_samples);
    int agree = 0, scored = 0, differs = 0;
    for (int i = 300; i < T; i++) {
        agree += test_argmax(sp + (size_t)i * V, V) == test_argmax(dense + (size_t)i * V, V);
        differs |= memcmp(sp + (size_t)i * V, dense + (size_t)i * V, (size_t)V * 4) != 0;
        scored++;
    }
    CHECK(differs, "sparse logits identical to dense: selection had no effect");
    CHECK(agree >= 0.94 * scored, "top-1 agreement %d/%d", agree, scored);
    printf("budget 256 of %d: top-1 agreement %d/%d, recall %.3f, %.1f tokens attended per head\n", T, agree,
           scored, st1.sparse_recall, st1.attended_tokens);

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
    /* the length up to which every pass is dense: the smallest head budget
     * (256 x 0.5 here; the dense layer 0 does not count), the floor of sink +
     * one block + window while budgets adapt, none for a dense context */
    const int floor_len = (cp.sparse_sink_blocks + 1) * 16 + cp.sparse_window; /* 16-token KV blocks */
    CHECK(ellm_context_sparse_dense_len(ctx) == 128, "profile: dense up to %d, expected 128", ellm_context_sparse_dense_len(ctx));
    CHECK(ellm_context_load_sparse_profile(ctx, NULL, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_context_sparse_dense_len(ctx) == 256, "uniform: dense up to %d, expected 256", ellm_context_sparse_dense_len(ctx));
    ellm_context_set_sparse_adapt(ctx, 1);
    CHECK(ellm_context_sparse_dense_len(ctx) == floor_len, "adapting: dense up to %d, expected %d", ellm_context_sparse_dense_len(ctx), floor_len);
    ellm_context_set_sparse_adapt(ctx, 0);
    ellm_context_set_sparse(ctx, 8, &err);
    CHECK(ellm_context_sparse_dense_len(ctx) == floor_len, "budget 8: dense up to %d, expected %d", ellm_context_sparse_dense_len(ctx), floor_len);
    ellm_context_set_sparse(ctx, 0, &err);
    CHECK(ellm_context_sparse_dense_len(ctx) == INT_MAX, "dense: %d", ellm_context_sparse_dense_len(ctx));
    /* a budget past the int range once weighted is every position, not an
     * overflow (which had made it the floor) */
    ellm_context_set_sparse(ctx, INT_MAX, &err);
    CHECK(ellm_context_sparse_dense_len(ctx) == INT_MAX, "budget INT_MAX: dense up to %d", ellm_context_sparse_dense_len(ctx));
    ellm_context_set_sparse(ctx, 256, &err);
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
