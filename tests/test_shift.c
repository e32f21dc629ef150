/* Context shift: after ellm_context_shift the logits equal those of a fresh
 * context fed the kept tokens at their new positions (one-layer models, whose
 * keys depend only on token and position, with normal and NeoX RoPE, F32 and
 * F16 caches); the moved keys are the keys of their new positions; the sparse
 * index describes the moved keys exactly; and `ellm run --ctx-overflow`
 * stops with a message or keeps generating past the context. */
#include "harness.h"
#include "gguf_copy.h"

#include "attention/sparse_index_internal.h"
#include "core/fp16.h"
#include "engine/engine_impl.h"

#include <string.h>
#include <sys/wait.h>

/* `cmd` with stdout and stderr into out; as test_shell. */
static int sh(const char *cmd, char *out, size_t cap) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    return test_shell(full, out, cap);
}

/* Largest |a - b| over n floats, and the largest |b|. */
static double max_diff(const float *a, const float *b, int n, double *max_ref) {
    double d = 0, r = 0;
    for (int i = 0; i < n; i++) {
        double x = fabs((double)a[i] - b[i]);
        if (!(x <= d)) d = x;
        if (fabs(b[i]) > r) r = fabs(b[i]);
    }
    *max_ref = r;
    return d;
}

/* Shifts a context of `n` tokens (keep n_keep, discard n_discard), decodes one
 * more token and compares every logit with a fresh context fed the kept
 * tokens and that token. Tolerance relative to the largest logit. */
static void check_shift(ellm_model *m, const char *name, ellm_kv_type kv_type, int sparse, double tol) {
    ellm_error err = {0};
    const int n = 150, n_keep = 4, n_discard = 61;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 160;
    cp.n_threads = 2;
    cp.kv_type = kv_type;
    cp.n_batch = 64; /* the move runs in several chunks */
    cp.sparse_topk = sparse ? 64 : 0;
    ellm_context *a = NULL, *b = NULL;
    if (ellm_context_init(m, &cp, &a, &err) || ellm_context_init(m, &cp, &b, &err)) {
        CHECK(0, "%s: context: %s", name, err.msg);
        goto out;
    }
    const int n_vocab = m->cfg.n_vocab;
    int32_t toks[160], kept[160];
    uint64_t x = 12345;
    for (int i = 0; i < n + 1; i++) toks[i] = (int32_t)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % n_vocab;
    CHECK(ellm_decode(a, toks, n, NULL, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_context_shift(a, n_keep, n_discard, &err) == ELLM_OK, "%s: shift: %s", name, err.msg);
    CHECK(ellm_context_pos(a) == n - n_discard, "%s: pos %d after the shift", name, ellm_context_pos(a));
    int nk = 0;
    for (int i = 0; i < n; i++)
        if (i < n_keep || i >= n_keep + n_discard) kept[nk++] = toks[i];
    kept[nk++] = toks[n];
    CHECK(ellm_decode(b, kept, nk - 1, NULL, &err) == ELLM_OK, "%s", err.msg);

    /* the moved keys are the keys of their new positions (layer 0 of a 1-layer model) */
    const model_config *c = &m->cfg;
    double kd = 0, kr = 0;
    float ka[256], kb[256];
    for (int h = 0; h < c->n_head_kv; h++)
        for (int p = 0; p < nk - 1; p++) {
            kv_cache_key(a->kv, 0, h, p, ka);
            kv_cache_key(b->kv, 0, h, p, kb);
            double r, d = max_diff(ka, kb, c->head_dim, &r);
            if (d > kd) kd = d;
            if (r > kr) kr = r;
        }
    printf("%s: moved keys within %.3g of fresh ones (largest key %.3g)\n", name, kd, kr);
    /* F16: one re-rounding of the rotated key, at most about 1.5 F16 units in the last place */
    CHECK(kd <= (kv_type == ELLM_KV_F16 ? 1.5 * kr / 1024 : 1e-5 * kr), "%s: moved keys differ by %g", name, kd);

    CHECK(ellm_decode(a, &toks[n], 1, NULL, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_decode(b, &toks[n], 1, NULL, &err) == ELLM_OK, "%s", err.msg);
    double r, d = max_diff(ellm_context_logits(a), ellm_context_logits(b), n_vocab, &r);
    printf("%s: logits after the shift within %.3g of a fresh context (largest %.3g, %.2g relative)\n", name, d, r,
           d / r);
    CHECK(d <= tol * r, "%s: logits differ by %g (largest %g, tolerance %g relative)", name, d, r, tol);

    if (sparse) {
        /* every block summary is the (outward-rounded) min/max of the keys stored now */
        int exact = 1;
        float lo[256], hi[256], k[256];
        const int len = ellm_context_pos(a), bt = 16;
        for (int h = 0; h < c->n_head_kv; h++)
            for (int blk = 0; blk < (len + bt - 1) / bt; blk++) {
                sparse_index_summary(a->sidx, 0, h, 0, blk, lo, hi);
                float mn[256], mx[256];
                for (int ch = 0; ch < c->head_dim; ch++) mn[ch] = INFINITY, mx[ch] = -INFINITY;
                for (int p = blk * bt; p < len && p < (blk + 1) * bt; p++) {
                    kv_cache_key(a->kv, 0, h, p, k);
                    for (int ch = 0; ch < c->head_dim; ch++) {
                        if (k[ch] < mn[ch]) mn[ch] = k[ch];
                        if (k[ch] > mx[ch]) mx[ch] = k[ch];
                    }
                }
                for (int ch = 0; ch < c->head_dim; ch++)
                    exact &= kv_type == ELLM_KV_F16 ? lo[ch] == mn[ch] && hi[ch] == mx[ch]
                                                    : lo[ch] <= mn[ch] && hi[ch] >= mx[ch];
            }
        CHECK(exact, "%s: sparse summaries do not describe the moved keys", name);
    }
out:
    ellm_context_free(a);
    ellm_context_free(b);
}

/* The third case is the second with YaRN scaling (factor 4 over an original
 * context of 64): the cos and sin of its positions carry a magnitude
 * (1 + 0.1 ln 4) that a moved key has already, so the shift's rotation must
 * leave it out. */
static void test_shift_models(void) {
    const char *shapes[] = {"tiny-1layer", "tiny-qwen2-1layer", "tiny-qwen2-1layer"}, *labels[] = {"", "", " yarn"};
    const extra_key yarn[3] = {{"qwen2.rope.scaling.type", 's', "yarn", 0},
                               {"qwen2.rope.scaling.factor", 'f', NULL, 4},
                               {"qwen2.rope.scaling.original_context_length", 'u', NULL, 64}};
    for (int i = 0; i < 3; i++) {
        char cmd[1024], out[4096], path[700], scaled[700];
        snprintf(path, sizeof path, "%s/shift_%s.gguf", test_tmp_dir(), shapes[i]);
        snprintf(cmd, sizeof cmd, "%s synth --shape %s --type f16 --seed 3 -o %s", test_ellm_bin(), shapes[i], path);
        int rc = sh(cmd, out, sizeof out);
        CHECK(rc == 0, "synth %s: %s", shapes[i], out);
        if (i == 2) {
            snprintf(scaled, sizeof scaled, "%.600s.yarn.gguf", path);
            rc = !gguf_copy_with_keys(path, scaled, 0, yarn, 3);
            remove(path);
            snprintf(path, sizeof path, "%s", scaled);
        }
        ellm_model *m = NULL;
        ellm_error err = {0};
        if (rc || ellm_model_load(path, NULL, &m, &err) != ELLM_OK) {
            CHECK(0, "load %s: %s", path, err.msg);
            continue;
        }
        CHECK(m->cfg.rope_neox == (i >= 1), "%s: RoPE style", shapes[i]);
        CHECK((m->rope_mscale != 1.0) == (i == 2), "%s%s: RoPE magnitude %g", shapes[i], labels[i], m->rope_mscale);
        char name[128];
        /* F32 cache: only float rounding of the extra rotation (~1e-7 relative
         * per key) separates the two, so the logits agree to 1e-4. F16 cache:
         * the re-rotated key is rounded to F16 again (relative error up to
         * 2^-11 per element, where a fresh context rounds once), which moves
         * the scores by ~1e-3 of their size; the logits stay within 5e-3 of (8e-4 measured)
         * the largest logit. */
        snprintf(name, sizeof name, "%s%s f32", shapes[i], labels[i]);
        check_shift(m, name, ELLM_KV_F32, 0, 1e-4);
        snprintf(name, sizeof name, "%s%s f16", shapes[i], labels[i]);
        check_shift(m, name, ELLM_KV_F16, 0, 5e-3);
        snprintf(name, sizeof name, "%s%s f16 sparse", shapes[i], labels[i]);
        check_shift(m, name, ELLM_KV_F16, 1, 5e-3);
        ellm_model_free(m);
        remove(path);
    }
}

static void test_bad_args(void) {
    ellm_error err = {0};
    ellm_context *ctx = NULL;
    ellm_model *m = test_load_model("models/evalmodel.gguf", NULL);
    if (!m) return;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 64;
    CHECK(ellm_context_init(m, &cp, &ctx, &err) == ELLM_OK, "%s", err.msg);
    int32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    ellm_decode(ctx, t, 10, NULL, &err);
    CHECK(ellm_context_shift(ctx, 4, 7, &err) == ELLM_ERR_ARG && strstr(err.msg, "discard 7 of 10"), "%s", err.msg);
    CHECK(ellm_context_shift(ctx, 4, 0, &err) == ELLM_ERR_ARG, "discard 0");
    CHECK(ellm_context_pos(ctx) == 10, "a refused shift changes nothing");
    ellm_context_free(ctx);
    ellm_model_free(m);
}

static void test_cli(void) {
    static char out[65536];
    char cmd[1024];
    /* stop: ends at the context with a message, having generated what fit */
    snprintf(cmd, sizeof cmd, "%s run -c 96 -n 400 --temp 0 -t 2 -p 'import os' --ctx-overflow stop --stats", test_ellm_bin());
    int rc = sh(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "context full: 96 tokens held"), "stop: %d %s", rc, out);
    /* without the flag the run is refused up front */
    snprintf(cmd, sizeof cmd, "%s run -c 96 -n 400 -p 'import os'", test_ellm_bin());
    rc = sh(cmd, out, sizeof out);
    CHECK(rc != 0 && strstr(out, "--ctx-overflow"), "refused: %d %s", rc, out);
    /* shift: goes on past the context, dense and sparse */
    const char *modes[] = {"", "--sparse-topk 48"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s run -c 96 -n 400 --seed 2 -t 2 -p 'import os' --ctx-overflow shift --keep 4 %s --stats",
                 test_ellm_bin(), modes[i]);
        rc = sh(cmd, out, sizeof out);
        const char *dec = strstr(out, "decode: ");
        int n_dec = dec ? atoi(dec + 8) : -1;
        const char *sh_line = strstr(out, "context shifts: ");
        int shifts = sh_line ? atoi(sh_line + 16) : 0;
        /* EOS may end it early; otherwise 400 tokens through several shifts */
        CHECK(rc == 0 && n_dec > 96 && shifts >= 1, "shift %s: rc %d, %d tokens, %d shifts\n%s", modes[i], rc, n_dec,
              shifts, out);
        printf("shift %s: %d tokens generated through %d context shifts (context 96)\n", modes[i], n_dec, shifts);
    }
    /* save/resume across shifts continues exactly */
    static char want[65536], got[65536];
    snprintf(cmd, sizeof cmd, "%s run -c 96 -n 300 --seed 9 -t 2 -p 'def f(x):' --ctx-overflow shift 2>/dev/null", test_ellm_bin());
    rc = sh(cmd, want, sizeof want);
    snprintf(cmd, sizeof cmd,
             "%s run -c 96 -n 300 --seed 9 -t 2 -p 'def f(x):' --ctx-overflow shift --save-state %s "
             "--save-every 170 >/dev/null 2>&1 && %s run --resume %s 2>/dev/null",
             test_ellm_bin(), test_tmp_path("shift.state"), test_ellm_bin(), test_tmp_path("shift.state"));
    int rc2 = sh(cmd, got, sizeof got);
    CHECK(rc == 0 && rc2 == 0 && !strcmp(want, got), "resume after shifts differs (%d %d)\n%s\n---\n%s", rc, rc2, want,
          got);
    remove(test_tmp_path("shift.state"));
}

int main(void) {
    test_shift_models();
    test_bad_args();
    test_cli();
    return test_finish();
}
